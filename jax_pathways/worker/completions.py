"""Completions: reports each op to the controller once its arrays are ready.

Ops are issued asynchronously (PJRT returns arrays as futures), so an op is not
finished when the op loop moves on. One thread waits for the ops' arrays in
issue order and sends exactly one event per op. Waiting in order is cheap (an
island finishes its work roughly in order) and needs no thread per op. An op
whose arrays are ready when it is added (a launch PJRT ran inline, as CPU
does on one device; a read of a finished array) is reported at once by the
caller, without waking that thread, except while a trace records: its
timings need every report in op order.

Pushing bytes to other workers can take as long as a launch, so it has a
thread of its own ("sends", also in issue order): a slow receiver never
delays the reports of the launches behind a send. So does work on arrays of
the islands' global client ("spanning", in issue order): a program spanning
islands waits for every island, and when one is lost it never finishes
(nothing can cancel it), so abandon_spanning() reports it failed instead and
the island's own work goes on. A new generation of the global client gets a
spanning thread of its own (restart_spanning): the old one may stay stuck.
Events may therefore reach the controller out of order; it matches them by
sequence number.
"""
from __future__ import annotations

import contextlib
import queue
import re
import threading
import time
from typing import Any, Callable, Iterator, Sequence

from absl import logging

from jax_pathways import _core, threads
from jax_pathways.status import Code, Status, StatusError

# gloo's transport failing, or a pull's connection to the sender's transfer
# server closing: a peer worker went away (or was cut off: Transfers.cut).
_LINK_BROKE = re.compile(r"^(Error dispatching computation: )*(Gloo .*"
                         r"gloo/transport/|SocketServer: Connection closed)",
                         re.DOTALL)


# How often the watchdog looks for waits past their deadline, and after
# how long with nothing to watch it sleeps until the next watch.
WATCHDOG_PERIOD_S = 0.5
WATCHDOG_IDLE_S = 5.0

# finish() -> the event's payload (bytes-like); runs on the completion
# thread after the arrays are ready, so it may block on device data
# (fetches, sends).
Finish = Callable[[], Any]


def error_status(e: BaseException) -> Status:
  """An exception from jaxlib or our own code as a Status for the user."""
  if isinstance(e, StatusError):
    return e.status
  if isinstance(e, MemoryError):
    return Status(Code.RESOURCE_EXHAUSTED, f"worker out of host memory: {e}")
  text = str(e) or type(e).__name__
  prefix = text.split(":", 1)[0].strip()
  if prefix in Code.__members__ and prefix != "OK":
    message = text.split(":", 1)[1].strip()
    if _LINK_BROKE.search(message):
      # Only programs spanning islands use gloo, and its transport fails
      # when another island's worker went away: XLA says UNKNOWN (INTERNAL,
      # behind one "Error dispatching computation:" per program, in the
      # programs that took the failed arrays as arguments); a pulled array
      # says INTERNAL. The user (and pathwaysutils, which retries on
      # DATA_LOSS) must read the loss. The dispatcher holds a gang failed so
      # for the loss, whose words name the worker.
      return Status(Code.DATA_LOSS, f"{_core.BROKEN_LINK} ({message})")
    return Status(Code[prefix], message)
  if isinstance(e, (ValueError, TypeError)):
    return Status(Code.INVALID_ARGUMENT, text)
  if isinstance(e, NotImplementedError):
    return Status(Code.UNIMPLEMENTED, text)
  return Status(Code.INTERNAL, f"{type(e).__name__}: {text}")


class Completions:
  """The in-order completion thread of one worker."""

  def __init__(self, report: Callable[[int, Status, bytes, bool], None],
               stuck: Callable[[int, float], None] | None = None,
               tracing: Callable[[], bool] = lambda: False):
    """report(seq, status, payload, waited): waited says whether the op's
    arrays were still being computed when this thread got to them (if not,
    they were done some time before: see tracing.py); only asked while
    tracing() (a few calls into jaxlib per op otherwise spent for nothing).
    stuck(seq, seconds): op `seq`'s arrays were not ready within the
    deadline it was added with; nothing can cancel that wait."""
    self._report = report
    self._tracing = tracing
    self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
    self._sends: queue.SimpleQueue[Any] = queue.SimpleQueue()
    self._spanning: queue.SimpleQueue[Any] = queue.SimpleQueue()
    # Spanning ops not reported yet, and why they never will be (once lost).
    self._lock = threading.Lock()
    self._unreported: set[int] = set()
    self._lost: Status | None = None
    self._watchdog = _Watchdog(stuck) if stuck else None
    self._threads = [threads.start(lambda: self._run(self._queue),
                                   "jp-completions"),
                     threads.start(lambda: self._run(self._sends), "jp-sends")]
    self._spanning_thread = self._start_spanning(self._spanning)

  def _start_spanning(self, work: queue.SimpleQueue) -> threading.Thread:
    return threads.start(lambda: self._run(work, self._claim), "jp-spanning")

  def add(self, seq: int, arrays: Sequence[Any], finish: Finish | None = None,
          deadline_s: float | None = None, spanning: bool = False,
          quick: bool = False) -> None:
    """Reports `seq` once `arrays` are ready (then runs `finish`). With a
    deadline, waiting longer calls `stuck` (for arrays that depend on
    another process: a pulled array). `spanning`: the arrays are the global
    client's (see abandon_spanning). `quick`: `finish` is short and its
    report does not wait on the controller (a small payload), so both may
    run on this thread."""
    if not spanning:
      if (arrays and deadline_s is None and (finish is None or quick) and
          not self._tracing() and _ready(arrays)):
        self._finish(seq, arrays, finish)  # events are matched by seq
        return
      self._queue.put((seq, arrays, finish, deadline_s))
      return
    with self._lock:
      if self._lost is None:
        self._unreported.add(seq)
        self._spanning.put((seq, arrays, finish, deadline_s))
        return
    self.fail(seq, self._lost)

  def abandon_spanning(self, why: Status) -> None:
    """Another island is lost: spanning work waiting now, or added later,
    is reported failed with `why` at once."""
    with self._lock:
      self._lost = why
      abandoned, self._unreported = self._unreported, set()
    for seq in sorted(abandoned):
      self.fail(seq, why)

  def restart_spanning(self) -> None:
    """The global client has a new generation: its work goes to a new
    spanning thread, and is no longer failed at once. The old thread
    reports what it holds that was not abandoned, then ends (perhaps only
    when gloo gives up on a lost worker's collective)."""
    with self._lock:
      old = self._spanning
      self._spanning = queue.SimpleQueue()
      self._lost = None
      self._spanning_thread = self._start_spanning(self._spanning)
    old.put(None)

  def _claim(self, seq: int) -> bool:
    """Whether the spanning thread still reports `seq` (not abandoned)."""
    with self._lock:
      if seq not in self._unreported:
        return False
      self._unreported.discard(seq)
      return True

  def add_send(self, seq: int | None, arrays: Sequence[Any],
               finish: Finish) -> None:
    """Sending work, on the sends thread once `arrays` are ready: reports
    `seq` when done (None: part of an op whose event comes from elsewhere)."""
    self._sends.put((seq, arrays, finish, None))

  def sends_done(self) -> threading.Event:
    """Set once every send added so far has been pushed."""
    done = threading.Event()
    self._sends.put((None, [], lambda: done.set() or b"", None))
    return done

  def fail(self, seq: int, status: Status) -> None:
    """Reports a failed op, in order with the ops before it."""
    self._queue.put((seq, status, None, None))

  def close(self, wait: bool = True) -> None:
    """Stops the threads once they have reported what was added (`wait`),
    or at once."""
    for q in (self._queue, self._sends, self._spanning):
      q.put(None)
    with self._lock:
      lost = self._lost is not None
    if wait:
      for thread in self._threads:
        thread.join(timeout=30)
      if not lost:  # else it may wait for ever on an abandoned program
        self._spanning_thread.join(timeout=30)
    if self._watchdog is not None:
      self._watchdog.close()

  def _run(self, work: queue.SimpleQueue,
           claim: Callable[[int], bool] | None = None) -> None:
    while True:
      item = work.get()
      if item is None:
        return
      self._take(item, claim)
      # Not held while the next is awaited: a deleted array's device memory
      # is freed only once nothing refers to it, and the worker may idle.
      del item

  def _take(self, item: tuple[Any, ...],
            claim: Callable[[int], bool] | None) -> None:
    seq, arrays, finish, deadline_s = item
    if isinstance(arrays, Status):
      self._send(seq, arrays, b"", False)
      return
    self._finish(seq, arrays, finish, deadline_s, claim)

  def _finish(self, seq: int | None, arrays: Sequence[Any],
              finish: Finish | None, deadline_s: float | None = None,
              claim: Callable[[int], bool] | None = None) -> None:
    """Waits for `arrays`, runs `finish` and reports `seq`."""
    waited = self._tracing() and not _ready(arrays)
    try:
      if deadline_s is not None and self._watchdog is not None:
        with self._watchdog.watching(seq, deadline_s):
          _wait(arrays)
      else:
        _wait(arrays)
      payload = finish() if finish is not None else b""
      status = Status()
    except Exception as e:  # pylint: disable=broad-except
      payload, status = b"", error_status(e)
    if seq is not None and (claim is None or claim(seq)):
      self._send(seq, status, payload, waited)
    elif not status.ok:
      logging.warning("side work failed: %s", status)

  def _send(self, seq: int, status: Status, payload: Any,
            waited: bool) -> None:
    try:
      self._report(seq, status, payload, waited)
    except Exception as e:  # pylint: disable=broad-except
      # The controller is gone; the op loop notices and exits.
      logging.warning("could not report op %d: %s", seq, e)


def _ready(arrays: Sequence[Any]) -> bool:
  """Whether every array is done now (consumed ones count as done)."""
  try:
    return all(a.is_deleted() or a.is_ready() for a in arrays)
  except Exception:  # pylint: disable=broad-except
    return False  # _wait says what is wrong


def _wait(arrays: Sequence[Any]) -> None:
  """Until every array is ready. One that a later op already consumed (a
  donating launch, a DELETE) counts as ready: that op ran after it was
  made and reports any error itself; failing this op instead would poison
  its other results, which are fine."""
  for a in arrays:
    try:
      a.block_until_ready()
    except Exception:  # pylint: disable=broad-except
      if not a.is_deleted():
        raise


class _Watchdog:
  """Calls stuck(seq, seconds) when a watched wait outlives its deadline
  (found within WATCHDOG_PERIOD_S of it). One thread, looking every period
  while there is or lately was something to watch, asleep otherwise: a
  pipeline watches one pull per stage, and waking the thread at each (to
  wait for the new nearest deadline) cost the worker ~35 µs of CPU per
  stage; only a watch that finds it asleep wakes it now."""

  def __init__(self, stuck: Callable[[int, float], None]):
    self._stuck = stuck
    self._mu = threading.Condition()
    self._watched: dict[int, tuple[float, float]] = {}  # seq -> (due, s)
    self._asleep = True  # until the first watch
    self._closed = False
    self._thread = threads.start(self._run, "jp-watchdog")

  @contextlib.contextmanager
  def watching(self, seq: int, seconds: float) -> Iterator[None]:
    with self._mu:
      self._watched[seq] = (time.monotonic() + seconds, seconds)
      if self._asleep:
        self._asleep = False
        self._mu.notify()
    try:
      yield
    finally:
      with self._mu:
        self._watched.pop(seq, None)

  def close(self) -> None:
    with self._mu:
      self._closed = True
      self._mu.notify()
    self._thread.join(timeout=5)

  def _run(self) -> None:
    with self._mu:
      idle_since = time.monotonic()
      while not self._closed:
        if self._asleep:
          self._mu.wait()
          idle_since = time.monotonic()
          continue
        self._mu.wait(WATCHDOG_PERIOD_S)
        now = time.monotonic()
        for seq, (due, seconds) in list(self._watched.items()):
          if due <= now:
            del self._watched[seq]
            self._stuck(seq, seconds)
        if self._watched:
          idle_since = now
        elif now - idle_since >= WATCHDOG_IDLE_S:
          self._asleep = True
