"""ArrayStore: one session's array handles, in Python or in the fast path.

A training loop's steady-state requests (Execute of a program Python has
registered, CheckValueReady, DestructArray) are answered in C++ by
_core.FastPath (csrc/controller/fast_path/fast_path.h) when every array they name is in
its table. A handle lives in exactly one of the two tables: the outputs of a
registered program go to the C++ table; a request Python handles that names
one takes it over (the record moves here, as an Array). Records in C++ are
plain arrays, sharing nothing, except the shards C++ makes for a read
(FullyReplicatedShard, DisassembleIntoSingleDeviceArrays; per layout, a
ShardPlan Python made says how): another handle of a one-device array's
buffer, or new buffers holding parts of an array's memory. Taking one of
those over takes every record linked to it, rebuilt as Python's own (one
counted Buffer per buffer, shares_memory_with between a shard and its
array), so taking over loses nothing. Their dtype, shape, sharding and
islands are interned in Layouts (shared by the controller's sessions): C++
compares layout ids.
"""
from __future__ import annotations

import threading
from typing import Any, Iterator, Sequence

from jax_pathways import _core
from jax_pathways.controller import op_payloads
from jax_pathways.controller.arrays import Array, Buffer
from jax_pathways.controller.handle_store import HandleStore
from jax_pathways.programs.sharding import Sharding
from jax_pathways.resources.island import Island
from jax_pathways.status import StatusError, invalid_argument
from jax_pathways.validation import check_client_handle

Layout = tuple[tuple[Island, ...], str, tuple[int, ...], Sharding | None]


class Layouts:
  """Interned array layouts (islands, dtype, shape, sharding) -> ids."""

  def __init__(self):
    self._ids: dict[tuple[Any, ...], int] = {}
    self._layouts: list[Layout] = []
    self._plans: dict[int, _core.ShardPlan | None] = {}
    self._lock = threading.Lock()

  def id(self, islands: Sequence[Island], dtype: str,
         shape: Sequence[int], sharding: Sharding | None) -> int:
    # An island's generation is part of it: arrays of a lost worker's
    # generation are not those of its successor's.
    key = (tuple((i.id, i.generation) for i in islands), dtype, tuple(shape),
           sharding)
    with self._lock:
      found = self._ids.get(key)
      if found is None:
        found = self._ids[key] = len(self._layouts)
        self._layouts.append((tuple(islands), dtype, tuple(shape), sharding))
      return found

  def of_array(self, array: Array) -> int:
    return self.id(array.islands, array.dtype, array.shape, array.sharding)

  def plan(self, layout: int) -> _core.ShardPlan | None:
    """How the fast path splits an array of `layout` into single-device
    arrays, as handlers/array.py `_split` does (a shard per device, on its
    device, not tiled); None where Python answers: no sharding, several
    islands."""
    with self._lock:
      if layout in self._plans:
        return self._plans[layout]
      islands, dtype, shape, sharding = self._layouts[layout]
    plan = None
    if sharding is not None and len(islands) == 1:
      shard_shape = sharding.shard_shape(shape)
      kind = sharding.memory_kind
      n = len(sharding.devices)
      shards = [self.id(islands, dtype, shard_shape,
                        Sharding((d,), None, kind)) for d in sharding.devices]
      plan = _core.ShardPlan(
          islands[0].id, shards, sharding.op_sharding is None,
          op_payloads.shards([0]), op_payloads.shards(list(range(n))),
          # A one-device shard's plan is one entry: no deeper.
          [self.plan(s) for s in shards] if n > 1 else [])
    with self._lock:
      return self._plans.setdefault(layout, plan)

  def array(self, record: tuple[int, int, list[int], bool, int],
            shared: Buffer | None = None) -> Array:
    """The Array a fast-path record describes (on `shared`, if given)."""
    buffer, layout, _, donated, _ = record
    with self._lock:
      islands, dtype, shape, sharding = self._layouts[layout]
    return Array(buffer, islands, dtype, shape, sharding,
                 shared=shared or Buffer(donated=donated))


class ArrayStore(HandleStore[Array]):
  """A session's arrays: Python's HandleStore, backed by the fast path's
  table of `stream` (None: no fast path, everything here)."""

  def __init__(self, fast: Any | None, stream: int, layouts: Layouts):
    super().__init__("array")
    self._fast = fast
    self._stream = stream
    self.layouts = layouts
    # Handles the request being handled put here or took over.
    self._touched: set[int] = set()

  def put(self, handle: int, item: Array, *, minted: bool = False) -> None:
    if not minted:
      check_client_handle(handle, self.kind)
    if self._fast is not None:
      if self._fast.contains(self._stream, handle):
        raise invalid_argument(f"array handle {handle} is already in use")
      self._fast.note_client_handle(self._stream, handle)
      self._touched.add(handle)
    super().put(handle, item, minted=True)

  def put_fast(self, handle: int, array: Array, *, minted: bool = False
               ) -> None:
    """Puts a plain new array (a registered program's output) in the fast
    path's table, where the steady state finds it."""
    if self._fast is None:
      self.put(handle, array, minted=minted)
      return
    if not minted:
      check_client_handle(handle, self.kind)
    if handle in self:
      raise invalid_argument(f"array handle {handle} is already in use")
    self._fast.note_client_handle(self._stream, handle)
    self._to_fast(handle, array)

  def _to_fast(self, handle: int, array: Array) -> None:
    layout = self.layouts.of_array(array)
    self._fast.put(self._stream, handle, array.buffer, layout,
                   [i.id for i in array.islands], self.layouts.plan(layout))

  def _take(self, handle: int) -> Array | None:
    """The fast path's array under `handle`, moved here (with every record
    linked to it: other handles of its buffer, shards sharing its memory);
    or None."""
    if self._fast is None:
      return None
    records = self._fast.take(self._stream, handle)
    if not records:
      return None
    buffers: dict[int, Buffer] = {}
    for _, (buffer, _, _, donated, _) in records:
      shared = buffers.setdefault(buffer, Buffer(holders=0))
      shared.holders += 1
      shared.donated = shared.donated or donated
    arrays = [(h, r[4], self.layouts.array(r, buffers[r[0]]))
              for h, r in records]
    on_buffer = {array.buffer: array for _, _, array in arrays}
    for h, shares, array in arrays:
      super().put(h, array, minted=True)  # checked when first put
      self._touched.add(h)
      if shares in on_buffer:  # a shard made in C++, its array still here
        array.shares_memory_with(on_buffer[shares])
    return arrays[0][2]  # `handle`'s comes first

  def settle(self) -> None:
    """After a request: the plain arrays it made, used or took over go
    (back) to the fast path's table, so that the steady state finds every
    array it names there; the others (aliased, sharing memory, failed, deleted,
    donated) stay here."""
    touched, self._touched = self._touched, set()
    if self._fast is None:
      return
    for handle in touched:
      with self._lock:
        array = self._items.get(handle)
        if array is None or not _plain(array):
          continue
        del self._items[handle]
      self._to_fast(handle, array)

  def get(self, handle: int) -> Array:
    try:
      array = super().get(handle)
      self._touched.add(handle)  # perhaps plain by now (settle)
      return array
    except StatusError:
      taken = self._take(handle)
      if taken is None:
        raise
      return taken

  def pop(self, handle: int) -> Array:
    self._take(handle)
    return super().pop(handle)

  def discard(self, handle: int) -> Array | None:
    self._take(handle)
    return super().discard(handle)

  def drain(self) -> list[Array]:
    drained = super().drain()
    if self._fast is not None:
      drained += [self.layouts.array(r) for r in self._fast.close(self._stream)]
    return drained

  def __len__(self) -> int:
    n = super().__len__()
    if self._fast is not None:
      n += self._fast.count(self._stream)
    return n

  def __contains__(self, handle: object) -> bool:
    return super().__contains__(handle) or (
        self._fast is not None and isinstance(handle, int) and
        self._fast.contains(self._stream, handle))

  def values(self) -> Iterator[Array]:
    """Every array; those of the fast path's table as copies, to read."""
    arrays = list(super().values())
    if self._fast is not None:
      arrays += [self.layouts.array(r)
                 for _, r in self._fast.records(self._stream)]
    return iter(arrays)


def _plain(array: Array) -> bool:
  """Whether the fast path's record says all there is of `array`."""
  shared = array.shared
  return (not array.deleted and not array.released and array.error is None
          and array.sharding is not None and bool(array.islands) and
          shared.holders == 1 and not shared.shares and not shared.donated)
