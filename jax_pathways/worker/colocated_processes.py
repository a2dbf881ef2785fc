"""Colocated processes: each client's colocated Python process on this island.

A client's first colocated_python call here starts its process
(colocated/executor.py), with one end of a socket pair; later calls reuse
it. A process that died (the user's code crashed it) fails the call that
saw it die, naming how, and the next call starts a new one. A client's
session ending kills its process: whatever its functions still run, and
the objects they made, go with it. Processes are the worker's children and
end with it (they watch their parent).
"""
from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any, Sequence

from absl import logging
import numpy as np

from jax_pathways import config, threads
from jax_pathways.colocated import frames
from jax_pathways.status import Code, StatusError, failed_precondition
from jax_pathways.worker.pjrt_backend import np_dtype

# A new process imports jax and builds its device view first.
START_TIMEOUT_S = 120.0
# Room beyond a call's shard bytes in its answer: its header, and the
# serialized output specs JAX's discovery sends as a string.
_ANSWER_SLACK = 64 << 20


@dataclasses.dataclass
class _Process:
  popen: subprocess.Popen
  sock: socket.socket
  sent: set[str]  # functions it holds
  lock: threading.Lock


class ColocatedProcesses:
  """The colocated processes of this island's clients, by client number."""

  def __init__(self, island: int, enabled: bool):
    """enabled: whether the cluster owner lets clients run colocated Python
    here (it runs their code on this host)."""
    self._island = island
    self._enabled = enabled
    self._lock = threading.Lock()  # held for dict operations only
    self._processes: dict[int, _Process] = {}
    # One per client: a process starting (seconds: it imports jax) holds
    # its own client's next call, nobody else's.
    self._starting: dict[int, threading.Lock] = {}

  def call(self, client: int, hello: dict[str, Any], function: str,
           pickled: Any, inputs: Sequence[Sequence[tuple[int, np.ndarray]]],
           outputs: Sequence[Sequence[tuple[int, tuple[int, ...], str]]]
           ) -> list[list[np.ndarray]]:
    """Runs `function` on this island's shards `inputs` ((client device id,
    data) each); returns the shards `outputs` names ((client device id,
    shape, dtype) each) as the process made them."""
    p = self._process(client, hello)
    header: dict[str, Any] = {
        "op": "call", "function": function, "pickled": function not in p.sent,
        "inputs": [[(d, list(a.shape), _kind(a)) for d, a in shards]
                   for shards in inputs],
        "outputs": [[d for d, _, _ in shards] for shards in outputs]}
    blobs = [pickled] if header["pickled"] else []
    blobs += [frames.strings(a) if _kind(a) == "string" else
              frames.raw(a) for shards in inputs for _, a in shards]
    expected = sum(int(np.prod(shape)) * (np_dtype(dtype).itemsize
                                          if dtype != "string" else 0)
                   for shards in outputs for _, shape, dtype in shards)
    answer, got = self._ask(client, p, header, blobs,
                            expected + _ANSWER_SLACK)
    p.sent.add(function)
    return _outputs(answer, got, outputs)

  def drop(self, client: int, function: str) -> None:
    """The client let `function` go: its process forgets it."""
    with self._lock:
      p = self._processes.get(client)
    if p is not None and function in p.sent:
      p.sent.discard(function)
      self._ask(client, p, {"op": "drop", "function": function}, [], 1 << 20)

  def end(self, client: int) -> None:
    """The client's session ended: its process goes, whatever it runs.
    (On the op loop: the process is reaped by a thread of its own.)"""
    with self._lock:
      p = self._processes.pop(client, None)
      self._starting.pop(client, None)
    if p is not None:
      _kill(p, reap=False)

  def close(self) -> None:
    with self._lock:
      processes, self._processes = list(self._processes.values()), {}
    for p in processes:
      _kill(p)

  def _process(self, client: int, hello: dict[str, Any]) -> _Process:
    if not self._enabled:
      raise failed_precondition(
          "colocated Python is off on this cluster: its owner starts the "
          "workers with --colocated-python to let clients run code on them "
          "(docs/colocated_python.md)")
    with self._lock:
      starting = self._starting.setdefault(client, threading.Lock())
    with starting:
      with self._lock:
        p = self._processes.get(client)
      if p is not None and p.popen.poll() is None:
        return p
      if p is not None:  # it died: its socket and zombie go
        _kill(p)
      p = self._start(client, hello)
      with self._lock:
        ended = self._starting.get(client) is not starting
        if not ended:
          self._processes[client] = p
      if ended:  # the session ended while its process started
        _kill(p)
        raise StatusError(Code.ABORTED, f"client {client}'s session ended")
      return p

  def _start(self, client: int, hello: dict[str, Any]) -> _Process:
    ours, theirs = socket.socketpair()
    try:
      popen = subprocess.Popen(
          [sys.executable, "-m", "jax_pathways.colocated.executor",
           str(theirs.fileno())],
          pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
          start_new_session=True,
          # The user's code gets no cluster token: it is no client.
          env={k: v for k, v in os.environ.items() if k != config.TOKEN})
    finally:
      theirs.close()
    p = _Process(popen, ours, set(), threading.Lock())
    ours.settimeout(START_TIMEOUT_S)
    try:
      with p.lock:
        frames.send(ours, hello)
        answer, _ = frames.recv(ours, 1 << 20)
    except (OSError, ValueError) as e:
      _kill(p)
      raise self._died(client, p, e) from None
    if "error" in answer:
      _kill(p)
      raise failed_precondition(
          f"the colocated Python process of client {client} on island "
          f"{self._island} could not start: {answer['error']}")
    ours.settimeout(None)  # a call takes as long as the user's function
    logging.info("client %d: colocated Python process %d started (%s)",
                 client, popen.pid, answer.get("packages"))
    return p

  def _ask(self, client: int, p: _Process, header: dict[str, Any],
           blobs: list[Any], max_bytes: int
           ) -> tuple[dict[str, Any], list[memoryview]]:
    try:
      with p.lock:
        frames.send(p.sock, header, *blobs)
        answer, got = frames.recv(p.sock, max_bytes)
    except (OSError, ValueError) as e:
      with self._lock:
        if self._processes.get(client) is p:
          del self._processes[client]
      _kill(p)
      raise self._died(client, p, e) from None
    if "error" in answer:
      raise StatusError(Code.INVALID_ARGUMENT, (
          f"colocated Python function raised on island {self._island}:\n"
          f"{answer['error']}"))
    return answer, got

  def _died(self, client: int, p: _Process, e: BaseException) -> StatusError:
    code = p.popen.poll()
    how = (f"was killed by signal {-code}" if code is not None and code < 0
           else f"exited with status {code}" if code is not None
           else f"stopped answering ({e})")
    return StatusError(Code.ABORTED, (
        f"the colocated Python process of client {client} on island "
        f"{self._island} {how}: the function's call failed, and the objects "
        f"it held there are gone; the next call starts a new process"))


def _outputs(answer: dict[str, Any], got: list[memoryview],
             outputs: Sequence[Sequence[tuple[int, tuple[int, ...], str]]]
             ) -> list[list[np.ndarray]]:
  """The answer's shards, each checked against what was asked."""
  described = answer.get("outputs")
  if not isinstance(described, list) or len(described) != len(outputs) or (
      sum(len(d) for d in described) != len(got)):
    raise StatusError(Code.INTERNAL, "the colocated process answered a "
                      "different number of outputs than asked")
  out, n = [], 0
  for j, (wanted, said) in enumerate(zip(outputs, described)):
    shards = []
    for (device, shape, dtype), s in zip(wanted, said):
      blob = got[n]
      n += 1
      if dtype == "string" or s.get("dtype") == "string":
        if dtype != s.get("dtype") or list(shape) != s.get("shape"):
          raise _mismatch(j, device, s, shape, dtype)
        try:
          shards.append(frames.strings_shard(blob, shape))
        except ValueError as e:
          raise _mismatch(j, device, s, shape, dtype) from e
        continue
      if s.get("dtype") != dtype or s.get("shape") != list(shape) or (
          len(blob) != int(np.prod(shape)) * np_dtype(dtype).itemsize):
        raise _mismatch(j, device, s, shape, dtype)
      shards.append(np.frombuffer(blob, np_dtype(dtype)).reshape(shape))
    out.append(shards)
  return out


def _mismatch(j: int, device: int, said: Any, shape: Sequence[int],
              dtype: str) -> StatusError:
  return StatusError(Code.INVALID_ARGUMENT, (
      f"colocated Python function's output {j} on device {device} is "
      f"{said.get('dtype')}{said.get('shape')}; its spec makes that shard "
      f"{dtype}{list(shape)}"))


def _kill(p: _Process, reap: bool = True) -> None:
  """SIGKILLs the process and whatever it started (its process group);
  reaps it here or, with reap=False, on a thread of its own."""
  try:
    os.killpg(p.popen.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass
  p.sock.close()
  if reap:
    _reap(p.popen)
  else:
    threads.start(_reap, "jp-reap", p.popen)


def _reap(popen: subprocess.Popen) -> None:
  try:
    popen.wait(10)
  except subprocess.TimeoutExpired:
    logging.error("colocated process %d did not exit after SIGKILL",
                  popen.pid)


def _kind(shard: np.ndarray) -> str:
  return "string" if shard.dtype.kind == "T" else shard.dtype.name
