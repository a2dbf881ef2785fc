"""Status: an error code and message as they travel between the layers.

Codes use the absl/gRPC numbering, the same as the C++ core and the IFRT
proxy's tensorflow.StatusProto, so a worker's error reaches the user unchanged.
"""
from __future__ import annotations

import enum
from typing import NamedTuple


class Code(enum.IntEnum):
  OK = 0
  CANCELLED = 1
  UNKNOWN = 2
  INVALID_ARGUMENT = 3
  DEADLINE_EXCEEDED = 4
  NOT_FOUND = 5
  ALREADY_EXISTS = 6
  PERMISSION_DENIED = 7
  RESOURCE_EXHAUSTED = 8
  FAILED_PRECONDITION = 9
  ABORTED = 10
  OUT_OF_RANGE = 11
  UNIMPLEMENTED = 12
  INTERNAL = 13
  UNAVAILABLE = 14
  DATA_LOSS = 15
  UNAUTHENTICATED = 16


class Status(NamedTuple):
  code: int = Code.OK
  message: str = ""

  @property
  def ok(self) -> bool:
    return self.code == Code.OK

  def __str__(self) -> str:
    if self.ok:
      return "OK"
    return f"{Code(self.code).name}: {self.message}"


OK = Status()


class StatusError(Exception):
  """An error that carries the Status a reply should report."""

  def __init__(self, code: int, message: str):
    super().__init__(message)
    self.status = Status(int(code), message)


def brief(value: object) -> str:
  """`value` as an error message quotes it: its repr, cut to 80 characters
  (a hostile request's values can be of any size)."""
  text = repr(value)
  return text if len(text) <= 80 else text[:77] + "..."


def invalid_argument(message: str) -> StatusError:
  return StatusError(Code.INVALID_ARGUMENT, message)


def unimplemented(message: str) -> StatusError:
  return StatusError(Code.UNIMPLEMENTED, message)


def failed_precondition(message: str) -> StatusError:
  return StatusError(Code.FAILED_PRECONDITION, message)


def unavailable(message: str) -> StatusError:
  return StatusError(Code.UNAVAILABLE, message)


def from_exception(e: Exception) -> StatusError:
  """An exception raised by the C++ extensions, as a StatusError."""
  if isinstance(e, StatusError):
    return e
  if isinstance(e, TimeoutError):
    return StatusError(Code.DEADLINE_EXCEEDED, str(e))
  if isinstance(e, ValueError):
    return StatusError(Code.INVALID_ARGUMENT, str(e))
  return StatusError(getattr(e, "code", Code.INTERNAL), str(e))
