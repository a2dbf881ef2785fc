"""HostBufferStore: bytes on their way between a client and its arrays.

Uploads arrive on the HostBufferStore stream before (or while) the request
that consumes them is handled; downloads are stored before the
CopyToHostBuffer reply is sent, because the client looks them up only after
that reply and the lookup does not wait. Buffers live per session; a
session's buffers go when it ends.
"""
from __future__ import annotations

import threading

from jax_pathways.status import Code, StatusError


class HostBufferStore:
  """Thread-safe (session, handle) -> bytes."""

  def __init__(self):
    self._cv = threading.Condition()
    self._sessions: dict[int, dict[int, bytes]] = {}
    self._bytes = 0

  def open_session(self, session: int) -> None:
    with self._cv:
      self._sessions.setdefault(session, {})

  def close_session(self, session: int) -> None:
    with self._cv:
      buffers = self._sessions.pop(session, {})
      self._bytes -= sum(len(b) for b in buffers.values())
      self._cv.notify_all()

  def store(self, session: int, handle: int, data: bytes) -> None:
    with self._cv:
      buffers = self._session(session)
      if handle in buffers:
        raise StatusError(Code.ALREADY_EXISTS,
                          f"host buffer {handle} already exists")
      buffers[handle] = data
      self._bytes += len(data)
      self._cv.notify_all()

  def lookup(self, session: int, handle: int) -> bytes:
    with self._cv:
      buffers = self._session(session)
      if handle not in buffers:
        raise StatusError(Code.NOT_FOUND,
                          f"host buffer handle {handle} not found")
      return buffers[handle]

  def take(self, session: int, handle: int, timeout: float) -> bytes:
    """Waits for an upload, then removes and returns it."""
    with self._cv:
      if not self._cv.wait_for(
          lambda: (session not in self._sessions or
                   handle in self._sessions[session]), timeout):
        raise StatusError(
            Code.DEADLINE_EXCEEDED,
            f"the upload of host buffer {handle} did not arrive within "
            f"{timeout:.0f} s")
      data = self._session(session).pop(handle)
      self._bytes -= len(data)
      return data

  def delete(self, session: int, handle: int) -> None:
    with self._cv:
      buffers = self._session(session)
      if handle not in buffers:
        raise StatusError(Code.NOT_FOUND,
                          f"host buffer handle {handle} not found")
      self._bytes -= len(buffers.pop(handle))

  def total_bytes(self) -> int:
    with self._cv:
      return self._bytes

  def _session(self, session: int) -> dict[int, bytes]:
    if session not in self._sessions:
      raise StatusError(Code.NOT_FOUND, f"unknown session {session}")
    return self._sessions[session]
