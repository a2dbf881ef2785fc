"""PersistenceExecutable: a persistence request, run by the workers holding the shards.

pathwaysutils (and orbax's CloudPathwaysArrayHandler) compile a write or
read request (storage/requests.py) and execute it with an execution token:
a write takes the arrays as arguments and returns nothing, a read returns
the arrays. One launch is one gang: a SAVE or LOAD op on every island that
holds a shard, at the same place in each island's order as any launch, so
a save sees the values every launch before it made and a launch after a
restore sees the restored values. Each worker writes or reads its own
shards (storage/zarr_arrays.py); the controller sends where and how, never
bytes. The token's status is the gang's: set once every island's part is
durable (or read), or failed with the first island's error.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from jax_pathways.controller.arrays import Array, island_bytes
from jax_pathways.controller.dispatcher import IslandOp, OpKind
from jax_pathways.controller import uncompiled
from jax_pathways.controller.launch_context import LaunchContext
from jax_pathways.programs.sharding import Sharding
from jax_pathways.resources.island import Island
from jax_pathways.resources.topology import Topology
from jax_pathways.resources.virtual_slice import VirtualSlice
from jax_pathways.status import Status, invalid_argument
from jax_pathways.storage.requests import PersistenceRequest, StoredArray
from jax_pathways.wire import payloads

OnDone = Callable[..., None]  # (status, *_), as launches report


class PersistenceExecutable:
  """One compiled persistence request, as the execute handler sees an
  executable."""

  donated: tuple[int, ...] = ()

  def __init__(self, request: PersistenceRequest, slice_: VirtualSlice,
               topology: Topology):
    self.write = request.write
    self._arrays = request.arrays
    self._shardings: list[Sharding] = []
    self._islands: list[tuple[Island, ...]] = []
    for i, a in enumerate(request.arrays):
      sharding = slice_.physical_sharding(a.sharding)
      self._shardings.append(sharding)
      self._islands.append(tuple(topology.islands_of(
          sharding.devices, f"{a.path} (array {i} of the request)")))
    self._topology = topology
    self.num_parameters = len(self._arrays) if self.write else 0
    self.outputs: list[tuple[tuple[int, ...], str]] = (
        [] if self.write else [(a.shape, a.dtype) for a in self._arrays])
    self.output_shardings = [] if self.write else self._shardings
    self.output_islands = [] if self.write else self._islands
    self.devices = tuple(sorted({d for s in self._shardings
                                 for d in s.devices}))
    self.metadata = uncompiled.metadata(
        "pathways_persistence_" + ("write" if self.write else "read"),
        [len(shape) for shape, _ in self.outputs])

  def programs(self) -> list[Any]:
    """It holds no compiled program (nothing to release)."""
    return []

  def check_argument(self, i: int, array: Array) -> None:
    """A write's argument i is the array its request describes."""
    want = self._arrays[i]
    if array.shape != want.shape or array.sharding is None or (
        frozenset(array.sharding.devices) !=
        frozenset(self._shardings[i].devices)):
      got = [] if array.sharding is None else sorted(array.sharding.devices)
      raise invalid_argument(
          f"persistence write of {want.path}: argument {i} is "
          f"{array.dtype}{list(array.shape)} on devices {got}, the request "
          f"describes {list(want.shape)} on devices "
          f"{sorted(self._shardings[i].devices)}")

  def launch(self, context: LaunchContext, args: Sequence[Array],
             results: Sequence[int], on_done: OnDone | None) -> None:
    """One SAVE (LOAD) op on every island holding a shard, as one gang."""
    by_island: dict[int, list[int]] = {}
    for i, islands in enumerate(self._islands):
      for island in islands:
        by_island.setdefault(int(island.id), []).append(i)
    gang = []
    for island, indices in sorted(by_island.items()):
      items = [self._item(i) for i in indices]
      payload = payloads.encode({"arrays": items})
      if self.write:
        gang.append(IslandOp(island, OpKind.SAVE,
                             args=[args[i].buffer for i in indices],
                             payload=payload))
      else:
        gang.append(IslandOp(
            island, OpKind.LOAD, results=[results[i] for i in indices],
            payload=payload,
            result_bytes=[self._bytes(i)[island] for i in indices]))
    context.dispatcher.submit(gang, None if on_done is None else
                              self._naming(on_done))

  def _naming(self, on_done: OnDone) -> OnDone:
    """`on_done`, its failure naming the arrays it was for (a lost worker's
    error names the worker, not what it was saving)."""
    names = [a.path for a in self._arrays]
    what = ", ".join(names[:3]) + (f" and {len(names) - 3} more"
                                   if len(names) > 3 else "")
    verb = "saving" if self.write else "restoring"

    def done(status: Status, *rest: Any) -> None:
      if not status.ok:
        status = Status(status.code, f"{verb} {what}: {status.message}")
      on_done(status, *rest)

    return done

  def _item(self, i: int) -> dict[str, Any]:
    """What a worker is told of array i."""
    a: StoredArray = self._arrays[i]
    item: dict[str, Any] = {"location": a.location, "name": a.name,
                            "timeout_s": a.timeout_s}
    if not self.write:
      item.update(shape=list(a.shape), dtype=a.dtype,
                  sharding=self._shardings[i].worker_spec(self._topology))
    return item

  def _bytes(self, i: int) -> dict[int, int]:
    a = self._arrays[i]
    return island_bytes(a.dtype, a.shape, self._shardings[i], self._topology)
