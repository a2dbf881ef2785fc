"""ProgramReader: the controller reads what clients compile in processes of
their own.

MLIR reads a program recursively, one stack frame per level of nesting: a
megabyte of nested regions overflows the stack of whatever thread reads it
(SIGSEGV), and a program can be made to take seconds to read. A program is
input from a client like any other, and the controller is the one process
that must not fail, so it never reads one itself: a reader process (this
module's main) reads it and answers with what the controller needs (what
identifies the program, its custom calls: programs/custom_calls.py). A
reader that dies or takes longer than READ_TIMEOUT_S costs only that
program, which is refused; the next read starts a new reader. READERS of
them read at once, so one client's slow program holds up nobody for long.

The frames (wire/callback_messages.py's socket framing) hold payloads:
    controller -> reader  {"kind": "xla" | "ifrt_ir"}, blob: the program
    reader -> controller  {"identity": hex, "calls": [[target, config hex,
                           index]], "table", "largest"}  (xla)
                          {} (ifrt_ir: it reads; the controller reads it
                           again, knowing that it can)
                          or {"error": why}
"""
from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

from absl import logging

from jax_pathways.programs import custom_calls
from jax_pathways.status import invalid_argument
from jax_pathways.wire import callback_messages as frames
from jax_pathways.wire import payloads

READERS = 2
READ_TIMEOUT_S = 20.0
# A reader process reads with this much stack: deep enough for any program
# JAX writes (tens of levels; this reads thousands), half what the workers'
# threads that read the same program again have (8 MiB); a deeper one kills
# only the reader, at once.
READER_STACK_BYTES = 4 << 20


class ProgramReader:
  """Thread-safe; one per controller. read() blocks its caller (never the
  controller's sessions thread: controller/handlers/compile.py)."""

  def __init__(self):
    # Last in, first out: the reader start() made, or the one that read
    # last, serves the next read; a slot whose process never started is
    # taken only when every started one is busy (FIFO started a second
    # reader for the first program, the one start() made still waiting).
    self._idle: queue.LifoQueue[_Process | None] = queue.LifoQueue()
    for _ in range(READERS):
      self._idle.put(None)  # a slot; its process starts when first used
    self._lock = threading.Lock()
    self._processes: set[_Process] = set()
    self._closed = False

  def read_xla(self, program: bytes
               ) -> tuple[bytes, custom_calls.Content]:
    """(what identifies an XlaProgram's `program`, its custom calls)."""
    reply = self._read("xla", program)
    return bytes.fromhex(reply["identity"]), custom_calls.Content(
        tuple(custom_calls.CustomCall(t, bytes.fromhex(c), i)
              for t, c, i in reply["calls"]),
        reply["table"], int(reply["largest"]))

  def vet_ifrt_ir(self, program: bytes) -> None:
    """Returns once an IfrtIRProgram's MLIR has been read without harm."""
    self._read("ifrt_ir", program)

  def start(self) -> None:
    """Starts one reader now, in the background, so that the first compile
    does not wait for it to import JAX (a second in all)."""
    process = self._idle.get()
    try:
      if process is None:
        process = self._start()
    except _ReaderFailed:
      process = None
    self._idle.put(process)

  def _read(self, kind: str, program: bytes) -> dict[str, Any]:
    process = self._idle.get()
    try:
      if process is None or not process.alive():
        process = self._start()
      reply = process.ask(kind, program)
    except _ReaderFailed as e:
      self._forget(process)
      process = None
      raise invalid_argument(
          f"the program could not be read: {e}; a program JAX lowers reads "
          "in well under a second") from None
    finally:
      self._idle.put(process)
    if "error" in reply:
      raise invalid_argument(
          f"the program does not read as {_WHAT[kind]} "
          f"({str(reply['error'])[:300]}); send what JAX lowers")
    return reply

  def _start(self) -> "_Process":
    with self._lock:
      if self._closed:
        raise _ReaderFailed("the controller is stopping")
      process = _Process()
      self._processes.add(process)
      return process

  def _forget(self, process: "_Process | None") -> None:
    if process is None:
      return
    process.kill()
    with self._lock:
      self._processes.discard(process)

  def close(self) -> None:
    with self._lock:
      self._closed = True
      processes = list(self._processes)
      self._processes.clear()
    for process in processes:
      process.kill()


_WHAT = {"xla": "StableHLO", "ifrt_ir": "IFRT IR"}


class _ReaderFailed(Exception):
  """The reader process died or took too long."""


class _Process:
  """One reader process, over a socket pair."""

  def __init__(self):
    mine, theirs = socket.socketpair()
    self._sock = mine
    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)  # reads; never makes a backend
    # Nothing of the controller's own: its output is how a parent learns
    # that it died (EOF), which a reader holding it would hide. A reader
    # ends when its socket does (the controller's end closes as it dies).
    self._proc = subprocess.Popen(
        [sys.executable, "-m", "jax_pathways.programs.reader",
         str(theirs.fileno())], pass_fds=[theirs.fileno()], env=env,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    theirs.close()

  def alive(self) -> bool:
    return self._proc.poll() is None

  def ask(self, kind: str, program: bytes) -> dict[str, Any]:
    self._sock.settimeout(READ_TIMEOUT_S)
    try:
      frames.write_frame(self._sock, payloads.encode({"kind": kind}, program))
      data = frames.read_frame(self._sock)
    except socket.timeout:
      raise _ReaderFailed(
          f"reading it took longer than {READ_TIMEOUT_S:g} s") from None
    except (OSError, ValueError) as e:
      raise _ReaderFailed(self._why(e)) from None
    if data is None:
      raise _ReaderFailed(self._why(None))
    header, _ = payloads.decode(data)
    return header

  def _why(self, e: Exception | None) -> str:
    try:
      code = self._proc.wait(timeout=1)
    except subprocess.TimeoutExpired:
      return f"its reader broke ({e})"
    if code < 0:
      return (f"it killed its reader ({signal.Signals(-code).name}: nested "
              "too deep, or malformed)")
    return f"its reader exited with {code}"

  def kill(self) -> None:
    if self.alive():
      self._proc.kill()
    try:
      self._proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      logging.warning("program reader pid %d did not exit", self._proc.pid)
    self._sock.close()


# ---------------------------------------------------------------- the reader
def _answer(kind: str, program: bytes) -> dict[str, Any]:
  if kind == "xla":
    from jax_pathways.programs import xla_program  # pylint: disable=import-outside-toplevel
    identity, content = xla_program.read(program)
    return {"identity": identity.hex(),
            "calls": [[c.target, c.backend_config.hex(), c.index]
                      for c in content.calls],
            "table": content.table, "largest": content.largest_value}
  if kind == "ifrt_ir":
    from jax_pathways.programs import ifrt_ir_program  # pylint: disable=import-outside-toplevel
    ifrt_ir_program.parse(program)
    return {}
  return {"error": f"unknown kind {kind!r}"}


def _serve(fd: int) -> None:
  sock = socket.socket(fileno=fd)
  while True:
    data = frames.read_frame(sock)
    if data is None:
      return
    header, blobs = payloads.decode(data)
    try:
      reply = _answer(str(header.get("kind")), bytes(blobs[0]))
    except Exception as e:  # pylint: disable=broad-except
      reply = {"error": str(e) or type(e).__name__}
    frames.write_frame(sock, payloads.encode(reply))


def main() -> None:
  # The main thread's stack is fixed at start: read on a thread of a size
  # chosen here.
  threading.stack_size(READER_STACK_BYTES)
  thread = threading.Thread(target=_serve, args=(int(sys.argv[1]),))
  thread.start()
  thread.join()


if __name__ == "__main__":
  sys.setrecursionlimit(1 << 20)
  main()
