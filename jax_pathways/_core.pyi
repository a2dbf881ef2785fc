"""Stubs of the C++ core (csrc/): the contract between Python and C++.

Blocking methods release the GIL. Statuses travel as (code, message) with
absl/gRPC codes; raised errors are ValueError (INVALID_ARGUMENT),
NotImplementedError (UNIMPLEMENTED), TimeoutError (DEADLINE_EXCEEDED) or
JaxPathwaysError (everything else, with `.code`).
"""
import enum
from typing import Any, Sequence

import numpy as np

WIRE_VERSION: int

class JaxPathwaysError(RuntimeError):
  code: int

class OpKind(enum.Enum):
  COMPILE = 1
  LAUNCH = 2
  PUT = 3
  FETCH = 4
  DELETE = 5
  SEND = 6
  RECEIVE = 7
  COPY = 8
  SHUTDOWN = 9
  TRACE = 10
  PEER_LOST = 11
  JOIN_GLOBAL = 12

class Op:
  """An op as a worker receives it."""
  kind: OpKind
  seq: int
  program: int
  args: list[int]
  results: list[int]
  payload: np.ndarray  # read-only uint8 view, valid while the Op lives

# (island, kind, program, args, results, payload)
# The payload: bytes, or (head, tail) sent as head + tail; a tail that is a
# view of a HostBuffers upload is shared, not copied.
IslandOp = tuple[int, OpKind, int, Sequence[int], Sequence[int],
                 bytes | tuple[bytes, Any]]
# (tag, code, message, payloads)
Completion = tuple[int, int, str, list[bytes]]

class Dispatcher:
  """The controller's ordering, futures and in-flight windows."""
  def __init__(self, max_in_flight: int) -> None: ...
  def add_island(self, island: int, fd: int, name: str,
                 memory_bytes: int = 0) -> None: ...
  def submit(self, gang: Sequence[IslandOp], tag: int, client: int = 0,
             result_bytes: Sequence[Sequence[int]] = ()) -> None:
    """result_bytes[i][k]: device memory of op i's result k on its island."""
  def set_weight(self, client: int, weight: float) -> None: ...
  def forget_client(self, client: int) -> None: ...
  def expire_memory_waits(self, max_wait_s: float) -> None: ...
  def expire_silent_islands(self, timeout_s: float) -> None: ...
  def shares(self) -> list[dict]: ...
  def when_ready(self, ids: Sequence[int], tag: int) -> None: ...
  def state(self, id: int) -> tuple[str, tuple[int, str]]: ...
  def cork(self) -> None: ...
  def uncork(self) -> None: ...
  def forget(self, ids: Sequence[int]) -> None: ...
  def fail_island(self, island: int, code: int, message: str) -> None: ...
  def poll(self, timeout_s: float, max_items: int = 1024) -> list[Completion]: ...
  def stats(self) -> list[dict]: ...
  def live_buffers(self) -> int: ...
  def shutdown(self) -> None: ...

class Executor:
  """A worker's end of the controller channel: ops in gang order."""
  def __init__(self, controller_fd: int, controller: str = "",
               controller_timeout_s: float = 0.0) -> None: ...
  def next(self, timeout_s: float) -> Op | None: ...
  def complete(self, seq: int, code: int, message: str, payload: bytes) -> None: ...
  def backlog(self) -> int: ...
  def lost(self) -> str:
    """Why the controller is gone or silent; empty while connected."""
  def shutdown(self) -> None: ...

class PeerLinks:
  """A worker's data links to other workers."""
  def __init__(self) -> None: ...
  def add(self, fd: int, peer_name: str) -> int: ...
  def send(self, link: int, transfer_id: int, code: int, message: str,
           data: bytes) -> None: ...
  def receive(self, link: int, transfer_id: int, timeout_s: float) -> np.ndarray: ...
  def shutdown(self) -> None: ...
