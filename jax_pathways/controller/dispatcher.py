"""Dispatcher: the Python face of the C++ _core.Dispatcher.

Handlers describe work as IslandOps and get called back when it finishes; the
C++ core numbers the ops in each island's gang order, tracks every buffer as
a future, bounds launches in flight, shares saturated islands among clients
by weight, and never blocks the caller on device data. One thread here turns the core's completions into callbacks, so the
core holds no Python references.
"""
from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from typing import Any, Callable, Iterator, NamedTuple, Sequence

from absl import logging

from jax_pathways import _core
from jax_pathways import threads
from jax_pathways.status import Status

OpKind = _core.OpKind
# on_done(status, payloads): one payload per op of the gang, in gang order.
OnDone = Callable[[Status, list[bytes]], None]
# How long a launch may wait for memory other clients hold before it fails.
MEMORY_WAIT_S = 60.0
# How long a worker may send nothing (it sends a heartbeat every second)
# before it is lost: a stopped or wedged process is noticed in bounded time.
WORKER_TIMEOUT_S = 5.0
# How often the completion thread looks for lost islands at most.
LOST_CHECK_S = 0.1


class IslandOp(NamedTuple):
  island: int
  kind: OpKind
  program: int = 0
  args: Sequence[int] = ()
  results: Sequence[int] = ()
  # Bytes, or (head, tails) from payloads.parts(): large tails (uploads)
  # reach the worker's socket without being copied.
  payload: bytes | tuple[bytes, list[Any]] = b""
  # Device memory each result takes on this island (gangs wait for room).
  result_bytes: Sequence[int] = ()
  # A PUT: the stage its uploads were streamed to (stream_upload), 0: none.
  stage: int = 0
  # A buffer the op needs but does not take (a receive's source, sent by
  # another op): failed by the time the op is numbered, it fails the op too,
  # which would wait for bytes that never come. 0: none.
  fails_with: int = 0


class StageDest(NamedTuple):
  """Where an upload goes: `base` bytes into a stage of `total` bytes on
  `island`'s worker (the stage holds a PUT's tails, one upload or the
  array's shards on that island, back to back)."""
  island: int
  total: int
  base: int = 0


class Dispatcher:
  """Submits gangs of ops to islands; one instance per controller."""

  # Submissions reach the core as they are made, so the sessions' C++ fast
  # path may submit to the core beside them (a subclass that reorders
  # them, as benchmarks/naive_fifo.py does, must say False).
  in_order = True

  def __init__(self, max_in_flight: int, memory_wait_s: float,
               worker_timeout_s: float):
    self.max_in_flight = max_in_flight
    self.memory_wait_s = memory_wait_s
    self.worker_timeout_s = worker_timeout_s
    self._core = _core.Dispatcher(max_in_flight)
    self._tags = itertools.count(1)
    self._callbacks: dict[int, Callable[[Status, list[bytes]], None]] = {}
    self._lock = threading.Lock()
    self._stopping = False
    self._on_lost: Callable[[], None] | None = None
    self._lost: frozenset[int] = frozenset()
    self._next_lost_check = 0.0
    self._thread = threads.start(self._run, "jp-completions")

  def on_lost(self, callback: Callable[[], None]) -> None:
    """callback() on the completion thread soon after an island is lost
    (the loss fails its ops, which wakes that thread)."""
    self._on_lost = callback

  def new_buffers(self, n: int) -> list[int]:
    """Fresh buffer ids, from the core's one counter (the fast path draws
    from it too)."""
    return self._core.new_buffers(n)

  def new_transfers(self, n: int) -> list[int]:
    """Fresh transfer ids for moves between islands (an exchange op's
    `program`), made as the fast path makes them: random, so no one else's
    can collide with, or guess, them."""
    return self._core.new_transfers(n)

  @property
  def core(self) -> Any:
    """The C++ dispatcher, for the sessions' fast path."""
    return self._core

  @property
  def epoch(self) -> int:
    """Changes whenever an island is lost or rejoins (see FastPath)."""
    return self._core.epoch

  def add_island(self, island: int, sock: socket.socket, name: str,
                 memory_bytes: int) -> None:
    self._core.add_island(island, sock.detach(), name, memory_bytes)

  def submit(self, gang: Sequence[IslandOp], on_done: OnDone | None = None,
             client: int = 0) -> None:
    """Enqueues the gang on its islands, in `client`'s turn when they are
    saturated; `on_done` runs when all finished."""
    tag = self._file(on_done) if on_done is not None else 0
    self._core.submit([(op.island, op.kind, op.program, list(op.args),
                        list(op.results), op.payload) for op in gang], tag,
                      client, [list(op.result_bytes) for op in gang],
                      [op.stage for op in gang],
                      [op.fails_with for op in gang])

  def new_stage(self) -> int:
    """A fresh stage id: a PUT's tails, staged on its workers while the
    uploads in them arrive (stream_upload). A PUT naming the stage takes
    it, unstage() drops it."""
    return self._core.new_stage()

  def stream_upload(self, stage: int, dests: Sequence[StageDest]) -> Any:
    """The stream (for HostBuffers.take) that forwards an upload into
    `stage` on the workers of `dests` while it arrives."""
    return self._core.stream_upload(stage, [tuple(d) for d in dests])

  def unstage(self, islands: Sequence[int], stage: int) -> None:
    self._core.unstage(list(islands), stage)

  def for_client(self, client: int, weight: float) -> "ClientDispatcher":
    """This dispatcher as one client's session uses it."""
    self._core.set_weight(client, weight)
    return ClientDispatcher(self, client)

  def forget_client(self, client: int) -> None:
    self._core.forget_client(client)

  def shares(self) -> dict[int, dict]:
    """Client -> its weight and the device seconds it has received."""
    return {s["client"]: s for s in self._core.shares()}

  def when_ready(self, buffers: Sequence[int],
                 on_done: Callable[[Status], None]) -> None:
    """Calls `on_done` once every buffer is ready, or with the first error."""
    self._core.when_ready(list(buffers),
                          self._file(lambda status, _: on_done(status)))

  @contextlib.contextmanager
  def corked(self) -> Iterator[None]:
    """Holds ops submitted inside and sends them together on exit."""
    self._core.cork()
    try:
      yield
    finally:
      self._core.uncork()

  def state(self, buffer: int) -> tuple[str, Status]:
    name, (code, message) = self._core.state(buffer)
    return name, Status(code, message)

  def forget(self, buffers: Sequence[int]) -> None:
    self._core.forget(list(buffers))

  def fail_island(self, island: int, status: Status) -> None:
    self._core.fail_island(island, int(status.code), status.message)

  def note_loss(self, island: int, note: str) -> None:
    """Lost island `island`'s error ends with `note` from now on."""
    self._core.note_loss(island, note)

  def stats(self) -> list[dict]:
    return self._core.stats()

  def live_buffers(self) -> int:
    return self._core.live_buffers()

  def shutdown(self) -> None:
    self._stopping = True
    self._core.shutdown()
    self._thread.join(timeout=10)

  def _file(self, callback: OnDone) -> int:
    tag = next(self._tags)
    with self._lock:
      self._callbacks[tag] = callback
    return tag

  def _run(self) -> None:
    while True:
      done = self._core.poll(0.5, 1024)
      if not done and self._stopping:
        return
      self._core.expire_memory_waits(self.memory_wait_s)
      self._core.expire_silent_islands(self.worker_timeout_s)
      for tag, code, message, payloads in done:
        with self._lock:
          callback = self._callbacks.pop(tag, None)
        if callback is None:
          continue
        try:
          callback(Status(code, message), payloads)
        except Exception:  # pylint: disable=broad-except
          logging.exception("completion callback for tag %d failed", tag)
      self._notice_losses()

  def _notice_losses(self) -> None:
    """Calls on_lost's callback when islands were newly lost (looking at
    most every LOST_CHECK_S: stats() is not free)."""
    now = time.monotonic()
    if self._on_lost is None or now < self._next_lost_check:
      return
    self._next_lost_check = now + LOST_CHECK_S
    lost = frozenset(s["island"] for s in self._core.stats()
                     if not s["alive"])
    newly, self._lost = lost - self._lost, lost
    if newly:
      try:
        self._on_lost()
      except Exception:  # pylint: disable=broad-except
        logging.exception("on_lost callback failed")


class ClientDispatcher:
  """The dispatcher as one client's session uses it: its submissions are
  that client's (for proportional share); the rest is the shared
  dispatcher's."""

  def __init__(self, dispatcher: Dispatcher, client: int):
    self._dispatcher = dispatcher
    self.client = client

  def submit(self, gang: Sequence[IslandOp], on_done: OnDone | None = None
             ) -> None:
    self._dispatcher.submit(gang, on_done, self.client)

  @property
  def epoch(self) -> int:
    return self._dispatcher.epoch

  def new_buffers(self, n: int) -> list[int]:
    return self._dispatcher.new_buffers(n)

  def new_transfers(self, n: int) -> list[int]:
    return self._dispatcher.new_transfers(n)

  def new_stage(self) -> int:
    return self._dispatcher.new_stage()

  def stream_upload(self, stage: int, dests: Sequence[StageDest]) -> Any:
    return self._dispatcher.stream_upload(stage, dests)

  def unstage(self, islands: Sequence[int], stage: int) -> None:
    self._dispatcher.unstage(islands, stage)

  def when_ready(self, buffers: Sequence[int],
                 on_done: Callable[[Status], None]) -> None:
    self._dispatcher.when_ready(buffers, on_done)

  def corked(self) -> contextlib.AbstractContextManager[None]:
    return self._dispatcher.corked()

  def state(self, buffer: int) -> tuple[str, Status]:
    return self._dispatcher.state(buffer)

  def forget(self, buffers: Sequence[int]) -> None:
    self._dispatcher.forget(buffers)

  def end(self) -> None:
    """The client's session ended: its share is forgotten."""
    self._dispatcher.forget_client(self.client)
