"""Stubs of the controller's C++ gRPC frontend (csrc/controller/server/).

Only the controller loads this module (it links grpc++).
"""
import enum
from typing import Any

import numpy as np

class EventKind(enum.Enum):
  OPEN = 1      # a new IfrtSession stream
  REQUEST = 2   # one IfrtRequest on a stream
  CLOSED = 3    # no more requests on a stream
  UNARY = 4     # a unary call for Python (GetVersion, admin Status)
  WAKE = 5      # an upload or island a parked request waits for is there

# (kind, id, data, method, metadata, peer)
Event = tuple[EventKind, int, bytes, str, dict[str, bytes], str]

class HostBuffers:
  """The host-buffer side channel's store, per session."""
  def __init__(self) -> None: ...
  def open_session(self, session: int) -> None: ...
  def close_session(self, session: int) -> None: ...
  def take(self, session: int, handle: int, stream: Any = None
           ) -> tuple[Any, int] | None:
    """(pieces capsule, size): the upload, removed from the store (as a
    payload tail it is sent without a copy); None if it has not arrived
    yet: then the server wakes (a WAKE event) once it is stored, and
    `stream` (Dispatcher.stream_upload's) gets its pieces as they come."""
  def unstream(self, session: int, handle: int) -> None: ...
  def store(self, session: int, handle: int, data: bytes) -> None: ...
  def total_bytes(self) -> int: ...

class GrpcServer:
  host_buffers: HostBuffers
  def __init__(self) -> None: ...
  def start(self, address: str, max_request_bytes: int,
            first_message_timeout_s: float, python_unary: list[str],
            python_streams: list[str]) -> int:
    """`python_unary`, `python_streams`: the methods Python serves (a
    name ending in '/': every method of that service)."""
  def poll(self, timeout_s: float, max_items: int = 256) -> list[Event]: ...
  def send(self, id: int, data: bytes) -> bool: ...
  def cork(self) -> None:
    """This thread's sends only queue until uncork() (one write each)."""
  def uncork(self) -> None: ...
  def settle(self, id: int, n: int = 1) -> None:
    """Python has handled `n` more requests of session stream `id`."""
  def set_request_hook(self, hook: object) -> None:
    """_core.FastPath.hook()'s capsule; before start()."""
  def reply_sink(self) -> object: ...
  def admit(self, id: int) -> None:
    """Stream `id` has the right token: its messages are read from now on
    (none is before)."""
  def finish(self, id: int, code: int, message: str) -> None: ...
  def reply(self, id: int, code: int, message: str, data: bytes) -> None: ...
  def wake(self) -> None:
    """Queues a WAKE event (from any thread)."""
  def open_calls(self) -> int: ...
  def shutdown(self) -> None: ...
