"""Tracer: when asked, records when each op was issued and finished, and
which earlier ops made its inputs.

Timestamps are this host's wall clock (ns), so traces from several hosts line
up as well as their clocks do. A launch runs once it is issued and its
inputs are there (XLA:CPU runs independent programs side by side), so each
record names the ops whose results it reads (tracing.py computes its start
from their ends). Recording costs two clock reads and a few dict updates
per op, and nothing while off.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Any

MAX_EVENTS = 200_000


class Tracer:
  """Op timings of one worker, kept until the controller collects them."""

  def __init__(self):
    self.enabled = False
    self._lock = threading.Lock()
    self._open: dict[int, list[Any]] = {}
    self._done: collections.deque = collections.deque(maxlen=MAX_EVENTS)
    self._made_by: dict[int, int] = {}  # buffer handle -> the op's seq

  def start(self) -> None:
    with self._lock:
      self._open.clear()
      self._done.clear()
      self._made_by.clear()
      self.enabled = True

  def issuing(self, seq: int, kind: str, name: str, inputs: Any = (),
              outputs: Any = ()) -> list[Any] | None:
    """The op loop takes op `seq`, reading buffers `inputs` and making
    `outputs`; set [4] of the returned record when it has handed the op on
    (its results may be ready even before that)."""
    if not self.enabled:
      return None
    with self._lock:
      after = sorted({self._made_by[h] for h in inputs
                      if h in self._made_by})
      if len(self._made_by) > 4 * MAX_EVENTS:  # bounded: forget the oldest
        self._made_by.clear()
      for h in outputs:
        self._made_by[h] = seq
      record = [seq, kind, name, time.time_ns(), 0, 0, True, after]
      self._open[seq] = record
    return record

  def rename(self, seq: int, name: str) -> None:
    """Op `seq` (being issued) shows as `name`."""
    if self.enabled:
      with self._lock:
        record = self._open.get(seq)
        if record is not None:
          record[2] = name

  def finished(self, seq: int, waited: bool = True) -> None:
    """Op `seq`'s results are ready (called in op order); `waited`: they
    were not yet when the completion thread got to them, so now is when
    they became ready (else they did some time before now)."""
    if self.enabled:
      with self._lock:
        record = self._open.pop(seq, None)
        if record is not None:
          record[5] = time.time_ns()
          record[6] = waited
          self._done.append(record)

  def stop(self) -> list[list[Any]]:
    """[seq, kind, name, issue start, issue end, ready, waited, seqs of
    the ops that made its inputs] per finished op."""
    with self._lock:
      self.enabled = False
      events = list(self._done)
      self._open.clear()
      self._done.clear()
      self._made_by.clear()
    return events
