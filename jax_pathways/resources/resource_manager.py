"""ResourceManager: gives each client a virtual slice of the physical devices.

Slices may share devices: programs of clients on the same devices are
ordered by the dispatcher (one gang order per island) and share the devices'
time. Placement therefore only has to fit the topology; among the places
that fit it prefers the devices the fewest clients hold, and one island
over several (a slice within one island never pays for cross-island
collectives).
"""
from __future__ import annotations

import collections
import math
import threading
from typing import Callable

from jax_pathways.resources.island import Island
from jax_pathways.resources.topology import Topology
from jax_pathways.resources.virtual_slice import SliceRequest, VirtualSlice
from jax_pathways.status import Code, StatusError, invalid_argument


class ResourceManager:
  """Slices by owner (a session id); thread-safe."""

  def __init__(self, topology: Topology,
               lost_islands: Callable[[], set[int]] = set):
    """lost_islands(): the islands whose worker is lost; slices that do
    not name their devices or island are placed on the others."""
    self._topology = topology
    self._lost_islands = lost_islands
    self._lock = threading.Lock()
    self._slices: dict[int, VirtualSlice] = {}

  def allocate(self, owner: int, request: SliceRequest) -> VirtualSlice:
    """The owner's slice (the same one on every call); a clear error if the
    request cannot fit this cluster."""
    with self._lock:
      held = self._slices.get(owner)
      if held is not None:
        return held
      devices = self._place(request)
      placed = VirtualSlice(tuple(devices), request)
      self._slices[owner] = placed
      return placed

  def check(self, request: SliceRequest) -> None:
    """Raises what allocate() would, placing nothing."""
    with self._lock:
      self._place(request)

  def release(self, owner: int) -> None:
    with self._lock:
      self._slices.pop(owner, None)

  def slice_of(self, owner: int) -> VirtualSlice | None:
    with self._lock:
      return self._slices.get(owner)

  def holders(self) -> dict[int, int]:
    """Physical device -> how many slices hold it."""
    with self._lock:
      return self._holders()

  # ------------------------------------------------------------- placement
  def _holders(self) -> dict[int, int]:
    return collections.Counter(d for s in self._slices.values()
                               for d in s.physical_ids)

  def _place(self, request: SliceRequest) -> list[int]:
    islands = self._topology.islands()
    if request.island is not None:
      if request.island not in [i.id for i in islands]:
        raise invalid_argument(
            f"island {request.island} does not exist; the cluster has "
            f"islands 0..{len(islands) - 1}")
      islands = [i for i in islands if i.id == request.island]
    if request.devices is None:
      return [d for i in islands for d in i.device_ids]
    lost: set[int] = set()
    if request.island is None:
      lost = self._lost_islands()
      islands = [i for i in islands if i.id not in lost]
    n = request.devices
    load = self._holders()
    within = [i for i in islands if i.num_devices >= n]
    if within:
      def cost(island: Island) -> tuple[int, int]:
        return (sum(sorted(load.get(d, 0) for d in island.device_ids)[:n]),
                island.id)
      best = min(within, key=cost)
      chosen = sorted(best.device_ids, key=lambda d: (load.get(d, 0), d))[:n]
      return sorted(chosen)
    total = sum(i.num_devices for i in islands)
    if request.island is not None or n > total:
      where = (f"island {request.island} has {total} devices" if request.island
               is not None else f"the cluster has {total} devices in "
               f"{len(islands)} islands, so at most {total}" +
               (f" (its islands {sorted(lost)} are lost)" if lost else ""))
      raise StatusError(
          Code.RESOURCE_EXHAUSTED,
          f"a slice of {request.describe()} does not fit: {where}"
          + ("; leave island unset to span islands"
             if request.island is not None and n <= self._topology
             .num_devices() else ""))
    return self._span(islands, n, request, load)

  @staticmethod
  def _span(islands: list[Island], n: int, request: SliceRequest,
            load: dict[int, int]) -> list[int]:
    """Whole islands, least held first, then part of one more; a mesh keeps
    its rows (all axes but the first) within an island."""
    row = math.prod(request.mesh[1:]) if request.mesh else 1
    ordered = sorted(islands, key=lambda i: (sum(load.get(d, 0)
                                                 for d in i.device_ids), i.id))
    chosen: list[int] = []
    for island in ordered:
      take = min(island.num_devices, n - len(chosen))
      take -= take % row
      chosen.extend(sorted(island.device_ids,
                           key=lambda d: (load.get(d, 0), d))[:take])
      if len(chosen) == n:
        return sorted(chosen)
    raise StatusError(
        Code.RESOURCE_EXHAUSTED,
        f"a slice of {request.describe()} does not fit: its rows of {row} "
        "devices cannot be laid over the islands without splitting one")
