"""Tracing: start and stop op-timing records on every island.

A TRACE op takes its place in each island's gang order like any other, so
"stop" is answered only after every op submitted before it has finished, and
its reply carries each worker's records. A worker keeps one recording, so
Recording lets one client's profile (profile_executable.py) at a time own it.
"""
from __future__ import annotations

import json
import threading
from typing import Callable, Sequence

from jax_pathways.controller.dispatcher import Dispatcher, IslandOp, OpKind
from jax_pathways.resources.topology import Topology
from jax_pathways.status import Code, Status, failed_precondition
from jax_pathways.wire import payloads

# done(status, reply body)
OnTraced = Callable[[Status, bytes], None]
ACTIONS = ("start", "stop")


class Recording:
  """Which client's profile the islands are recording, if any: a second
  start would clear the first one's records, so it is refused, not queued."""

  def __init__(self):
    self._lock = threading.Lock()
    self._owner: int | None = None

  def claim(self, owner: int) -> None:
    with self._lock:
      if self._owner not in (None, owner):
        raise failed_precondition(
            f"client {self._owner} is profiling the islands; they record one "
            "profile at a time: stop that trace first")
      self._owner = owner

  def release(self, owner: int) -> None:
    """`owner` no longer holds it (if it did: another's claim stays)."""
    with self._lock:
      if self._owner == owner:
        self._owner = None


def trace(topology: Topology, dispatcher: Dispatcher, action: str,
          done: OnTraced, islands: Sequence[int] | None = None) -> None:
  """Starts or stops recording on `islands` (default: all); on stop, replies
  {"islands": {id: [...]}}."""
  if action not in ACTIONS:
    done(Status(Code.INVALID_ARGUMENT,
                f"trace action must be one of {ACTIONS}, not {action!r}"), b"")
    return
  islands = ([island.id for island in topology.islands()] if islands is None
             else list(islands))
  if not islands:
    done(Status(Code.FAILED_PRECONDITION, "no islands have joined yet"), b"")
    return
  payload = payloads.encode({"action": action})

  def finished(status: Status, bodies: list[bytes]) -> None:
    if not status.ok:
      done(status, b"")
      return
    try:
      records = ({str(i): json.loads(bytes(b))
                  for i, b in zip(islands, bodies)}
                 if action == "stop" else {})
    except ValueError as e:
      done(Status(Code.DATA_LOSS, f"unreadable trace from a worker: {e}"),
           b"")
      return
    done(status, json.dumps({"islands": records}).encode())

  dispatcher.submit([IslandOp(i, OpKind.TRACE, payload=payload)
                     for i in islands], finished)
