"""Simulated islands: workers that acknowledge ops without computing.

    jax-pathways worker --controller HOST:PORT --simulate N [--devices D]

One process joins the controller as N islands of D devices each. Every
island has its own connection, heartbeat and gang order (a C++ Executor, as
a real worker's) and a thread that answers each op as soon as it is handed
out: launches, uploads and deletions run nothing. It exists to measure the
controller alone at scale (benchmarks/scale_benchmark.py: thousands of
islands on one machine), so:
  - COMPILE compiles for real, once per distinct program, on this process's
    own CPU devices, so that the controller gets a true signature;
  - FETCH returns zeros of the array's size (results are never computed);
    an upload's shards, and the arrays a COPY makes of them, have their
    own sizes (benchmarks/big_transfer_benchmark.py: the client's
    ceiling against a controller whose islands only discard bytes);
  - programs spanning islands, other copies and moves between islands are
    answered UNIMPLEMENTED.
"""
from __future__ import annotations

import json
import math
import threading
from typing import Any, Callable

from absl import logging

from jax_pathways import dtypes
from jax_pathways.status import Code
from jax_pathways.wire import payloads

# Ops an island takes per wake-up, as worker.OPS_PER_WAKE (that module
# imports JAX, which must not load before configure_jax()).
OPS_PER_WAKE = 64
UNSIMULATED = ("simulated islands run island-local programs, uploads, "
               "fetches, copies of an upload's shards and deletions only")


class SimulatedIsland:
  """One island's op loop: answers every op at once."""

  def __init__(self, executor: Any, compile_program: Callable[..., Any]):
    """compile_program(program, options, devices, replicas) -> a
    pjrt_backend.Program (shared by the process's islands)."""
    self._executor = executor
    self._compile = compile_program
    self._outputs: dict[int, list[int]] = {}  # program -> bytes per output
    self._sizes: dict[int, int] = {}          # buffer -> bytes
    # buffer -> bytes of its shard on each of the island's devices, in
    # device order (what a COPY of its local shards makes).
    self._shards: dict[int, list[int]] = {}
    # Zeros of each size fetched: made once (a fresh buffer per fetch would
    # time the host's page faults, not the path: big transfers' ceiling).
    self._zeros: dict[int, bytes] = {}

  def run(self) -> str | None:
    """Answers ops until told to stop (None) or the controller is gone
    (why)."""
    from jax_pathways import _core  # pylint: disable=import-outside-toplevel
    kinds = _core.OpKind
    while True:
      try:
        ops = self._executor.next_batch(1.0, OPS_PER_WAKE)
      except _core.JaxPathwaysError as e:
        return str(e)
      for op in ops:
        if op.kind == kinds.PEER_LOST:
          continue
        if op.kind == kinds.DELETE:  # never answered (transport/messages.h)
          for b in op.args:
            self._sizes.pop(b, None)
            self._shards.pop(b, None)
          continue
        try:
          payload = self._answer(op, kinds)
          code, message = Code.OK, ""
        except Exception as e:  # pylint: disable=broad-except
          payload, code, message = b"", Code.UNIMPLEMENTED, f"{e}"
          if not isinstance(e, NotImplementedError):
            code = Code.INVALID_ARGUMENT
        self._executor.complete(op.seq, int(code), message, payload)
        if op.kind == kinds.SHUTDOWN:
          return None

  def _answer(self, op: Any, kinds: Any) -> bytes:
    if op.kind == kinds.LAUNCH:
      for b, size in zip(op.results, self._outputs[op.program]):
        self._sizes[b] = size
      return b""
    if op.kind == kinds.PUT:
      header, _ = payloads.decode(op.payload)
      self._sizes[op.results[0]] = _nbytes(header["shape"], header["dtype"])
      if "shards" in header:
        by_device = {d: _nbytes(spec["shape"], spec["dtype"])
                     for spec in header["shards"] for d in spec["devices"]}
        self._shards[op.results[0]] = [by_device[d]
                                       for d in sorted(by_device)]
      elif header["sharding"].get("op_sharding") is None:  # replicated
        self._shards[op.results[0]] = [self._sizes[op.results[0]]] * len(
            header["sharding"]["devices"])
      return b""
    if op.kind == kinds.FETCH:
      size = self._sizes[op.args[0]]
      if size not in self._zeros:
        self._zeros[size] = bytes(size)
      return self._zeros[size]
    if op.kind == kinds.COPY:
      header, _ = payloads.decode(op.payload)
      if header.get("mode") != "shards" or op.args[0] not in self._shards:
        raise NotImplementedError(f"COPY: {UNSIMULATED}")
      local = self._shards[op.args[0]]
      for b, position in zip(op.results, header["positions"]):
        self._sizes[b] = local[position]
      return b""
    if op.kind == kinds.COMPILE:
      header, (program, options) = payloads.decode(op.payload)
      if not all(isinstance(d, int) for d in header["devices"]):
        raise NotImplementedError(UNSIMULATED)
      compiled = self._compile(bytes(program), bytes(options),
                               header["devices"], header["replicas"])
      self._outputs[op.program] = [_nbytes(o["shape"], o["dtype"])
                                   for o in compiled.metadata["outputs"]]
      return json.dumps(compiled.metadata).encode()
    if op.kind in (kinds.SHUTDOWN, kinds.TRACE):
      return b""
    raise NotImplementedError(f"{op.kind.name}: {UNSIMULATED}")


def _nbytes(shape: list[int], dtype: str) -> int:
  return math.prod(shape) * dtypes.itemsize(dtype)


def run(controller: str, islands: int, devices: int | None,
        token: str | None, connect_timeout: float,
        controller_timeout: float) -> int:
  """Joins `controller` as `islands` simulated islands and serves until
  each is told to stop or loses the controller; returns an exit code."""
  # pylint: disable=import-outside-toplevel
  from jax_pathways import _core
  from jax_pathways import threads
  from jax_pathways.cluster import addresses
  from jax_pathways.worker.join import configure_jax, worker_hello
  configure_jax("cpu")
  from jax_pathways.worker.pjrt_backend import PjrtBackend

  backend = PjrtBackend(devices)
  lock = threading.Lock()

  def compile_program(*args: Any) -> Any:
    with lock:  # one compile at a time; the backend caches by program
      return backend.compile(*args)

  hello = worker_hello(backend, None, 0, "", "")
  loops = []
  for _ in range(islands):
    sock, welcome = addresses.dial(controller, token, hello, connect_timeout)
    executor = _core.Executor(sock.detach(), controller, controller_timeout)
    loops.append((int(welcome["island"]), executor))
  logging.info("%d simulated islands joined (%s)", islands,
               ", ".join(str(i) for i, _ in loops[:8]) +
               (" ..." if islands > 8 else ""))
  ended: list[str | None] = []
  running = [threads.start(
      lambda e=e: ended.append(SimulatedIsland(e, compile_program).run()),
      f"jp-sim-{i}") for i, e in loops]
  for t in running:
    t.join()
  for _, executor in loops:
    executor.shutdown()
  lost = [why for why in ended if why is not None]
  if lost:
    logging.warning("simulated islands lost the controller: %s", lost[0])
  return 0
