"""Tracing: start and stop op-timing records on every island.

A TRACE op takes its place in each island's gang order like any other, so
"stop" is answered only after every op submitted before it has finished, and
its reply carries each worker's records.
"""
from __future__ import annotations

import json
from typing import Callable

from jax_pathways.dispatch import payloads
from jax_pathways.dispatch.dispatcher import Dispatcher, IslandOp, OpKind
from jax_pathways.resources.topology import Topology
from jax_pathways.status import Code, Status

# done(status, reply body)
OnTraced = Callable[[Status, bytes], None]
ACTIONS = ("start", "stop")


def trace(topology: Topology, dispatcher: Dispatcher, action: str,
          done: OnTraced) -> None:
  """Starts or stops recording; on stop, replies {"islands": {id: [...]}}."""
  if action not in ACTIONS:
    done(Status(Code.INVALID_ARGUMENT,
                f"trace action must be one of {ACTIONS}, not {action!r}"), b"")
    return
  islands = [island.id for island in topology.islands()]
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
