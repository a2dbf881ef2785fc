"""Tracer: when asked, records when each op was issued and finished.

Timestamps are this host's wall clock (ns), so traces from several hosts line
up as well as their clocks do. Recording costs two clock reads and a dict
update per op, and nothing while off.
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

  def start(self) -> None:
    with self._lock:
      self._open.clear()
      self._done.clear()
      self.enabled = True

  def issuing(self, seq: int, kind: str, name: str) -> list[Any] | None:
    """The op loop takes op `seq`; set [4] of the returned record when it
    has handed the op on (its results may be ready even before that)."""
    if not self.enabled:
      return None
    record = [seq, kind, name, time.time_ns(), 0, 0, True]
    with self._lock:
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
    """[seq, kind, name, issue start, issue end, ready, waited] per
    finished op."""
    with self._lock:
      self.enabled = False
      events = list(self._done)
      self._open.clear()
      self._done.clear()
    return events
