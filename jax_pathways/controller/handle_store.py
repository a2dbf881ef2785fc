"""HandleStore: one session's handles of one kind -> the objects they name.

Clients mint most handles themselves (counting up from 1); the controller
mints the rest from 2**48 up, so the two can never collide. A session keeps
one store per kind (arrays, executables, futures), so a number may name an
array and a host buffer at once, as the client expects.
"""
from __future__ import annotations

import itertools
import threading
from typing import Generic, Iterator, TypeVar

from jax_pathways.status import Code, StatusError, invalid_argument
from jax_pathways.validation import SERVER_HANDLES_START, check_client_handle

T = TypeVar("T")



class HandleStore(Generic[T]):
  """Thread-safe handle -> object map; `kind` names it in errors."""

  def __init__(self, kind: str):
    self.kind = kind
    self._items: dict[int, T] = {}
    self._lock = threading.Lock()

  def put(self, handle: int, item: T, *, minted: bool = False) -> None:
    """Names `item` by a handle not in use: one handle never names two
    objects, and nothing the client holds is dropped unreleased. A handle
    the client chose (not `minted` by ServerHandles) must be below
    SERVER_HANDLES_START, or it could take one the controller mints later."""
    if not minted:
      check_client_handle(handle, self.kind)
    with self._lock:
      if handle in self._items:
        raise invalid_argument(f"{self.kind} handle {handle} is already in use")
      self._items[handle] = item

  def get(self, handle: int) -> T:
    with self._lock:
      item = self._items.get(handle)
    if item is None:
      raise StatusError(Code.NOT_FOUND, f"unknown {self.kind} handle: {handle}")
    return item

  def pop(self, handle: int) -> T:
    with self._lock:
      item = self._items.pop(handle, None)
    if item is None:
      raise StatusError(Code.NOT_FOUND, f"unknown {self.kind} handle: {handle}")
    return item

  def discard(self, handle: int) -> T | None:
    with self._lock:
      return self._items.pop(handle, None)

  def drain(self) -> list[T]:
    with self._lock:
      items = list(self._items.values())
      self._items.clear()
    return items

  def __len__(self) -> int:
    with self._lock:
      return len(self._items)

  def __contains__(self, handle: object) -> bool:
    with self._lock:
      return handle in self._items

  def values(self) -> Iterator[T]:
    with self._lock:
      return iter(list(self._items.values()))


class ServerHandles:
  """Mints controller-side handles (>= 2**48); thread-safe."""

  def __init__(self):
    self._next = itertools.count(SERVER_HANDLES_START)
    self._lock = threading.Lock()

  def new(self) -> int:
    with self._lock:
      return next(self._next)
