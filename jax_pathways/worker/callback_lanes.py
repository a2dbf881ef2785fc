"""Lanes: ops that wait on a client's callbacks, off the op loop.

A launch whose program calls back into its client (worker/callback_binding.py)
can last as long as the client takes to answer: an io_callback may wait
for a file, a client may be stopped. The op loop serves every client of
the island and issues ops without waiting for data, so such a launch runs
on a lane instead: a thread of its program's (each program's callbacks
belong to one client), which issues it, waits for it to finish (so that a
failed callback belongs to the launch that made it; XLA:CPU runs a
program's launches one at a time anyway) and reports it.

Its results are Pending until then. An op that needs one, and one that
must come after a lane's op (a launch spanning islands, whose order must
match every other island's; a launch that donates what a lane's op still
reads), follows it on the lane, waiting for what it depends on. Everything
else goes on on the op loop. Ops only ever wait for earlier ops, so no
two wait for each other.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable

from jax_pathways import threads

# How long a lane's thread waits for work before it ends (a new one starts
# with the next op).
IDLE_S = 10.0


class Pending:
  """A result of an op on a lane, until the op has run: then its array, or
  the Status it failed with."""

  __slots__ = ("lane", "_done", "_value")

  def __init__(self, lane: "Lane"):
    self.lane = lane
    self._done = threading.Event()
    self._value: Any = None

  def resolve(self, value: Any) -> None:
    self._value = value
    self._done.set()

  @property
  def done(self) -> bool:
    return self._done.is_set()

  def wait(self) -> Any:
    self._done.wait()
    return self._value


class Task:
  """An op on a lane: what it waits for, and when it has been issued."""

  __slots__ = ("run", "after", "results", "lane", "issued")

  def __init__(self, run: Callable[["Task"], None], after: list[Any],
               results: list[Pending], lane: "Lane"):
    self.run = run
    self.after = after        # Pendings and Tasks of earlier ops
    self.results = results
    self.lane = lane
    self.issued = threading.Event()

  def wait(self) -> None:
    for dep in self.after:
      if isinstance(dep, Task):
        dep.issued.wait()
      else:
        dep.wait()


class Lane:
  """One thread running its tasks in order; it ends when idle and starts
  again with the next task."""

  def __init__(self, name: str):
    self._name = name
    self._lock = threading.Lock()
    self._queue: queue.SimpleQueue[Task] = queue.SimpleQueue()
    self._queued = 0
    self._running = False

  def submit(self, task: Task) -> None:
    with self._lock:
      self._queued += 1
      start = not self._running
      self._running = True
    self._queue.put(task)
    if start:
      threads.start(self._run, self._name)

  def _run(self) -> None:
    while True:
      try:
        task = self._queue.get(timeout=IDLE_S)
      except queue.Empty:
        with self._lock:
          if self._queued == 0:
            self._running = False
            return
        continue
      try:
        task.wait()
        task.run(task)
      finally:
        task.issued.set()
        with self._lock:
          self._queued -= 1
