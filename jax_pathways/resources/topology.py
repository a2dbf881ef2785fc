"""Topology: the islands of a cluster and the global ids of their devices.

Workers register in any order; once the expected number has joined, devices
get global ids in island order (island 0's devices first), so the ids a
client sees do not depend on who started first.

An island whose worker was lost (the dispatcher knows: `lost`) may be
registered again by a new worker with as many devices: it becomes the
island's next generation, with the same global device ids.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Iterable

from jax_pathways.programs import custom_calls
from jax_pathways.resources.island import DeviceId, Island, IslandId
from jax_pathways.status import Code, StatusError, invalid_argument


class Topology:
  """Islands by id, device ids by island; thread-safe."""

  def __init__(self, expected_islands: int,
               lost: Callable[[], set[int]] = set):
    """lost: the islands whose worker is lost now (the dispatcher's record,
    the one source of truth); their ids may be registered again."""
    self.expected_islands = expected_islands
    self._lost = lost
    self._mu = threading.Lock()
    self._islands: dict[IslandId, Island] = {}
    self._connected: set[IslandId] = set()
    # Lost islands a new worker is taking, until it is connected (or
    # abandoned): island -> the lost worker's Island.
    self._rejoining: dict[IslandId, Island] = {}
    self._when_complete: list[Callable[[], None]] = []
    # Device id -> its island's id, built on first use after the islands
    # change (a request places its arrays device by device; thousands of
    # islands must not make that a scan).
    self._device_islands: dict[int, IslandId] | None = None

  def register(self, hello: dict[str, Any]) -> Island:
    """Admits a worker's hello; raises ValueError with the reason to refuse."""
    lost = self._lost()  # not under _mu: it asks the dispatcher
    with self._mu:
      wanted = hello.get("island")
      free = set(range(self.expected_islands)) - set(self._islands)
      if wanted is None:
        if not free and not lost:
          raise ValueError(
              f"the cluster already has its {self.expected_islands} islands")
        wanted = min(free or lost)
      if not isinstance(wanted, int) or not 0 <= wanted < self.expected_islands:
        raise ValueError(f"island {wanted!r} is not in 0..{self.expected_islands - 1}")
      before = self._islands.get(IslandId(wanted))
      if before is not None and (wanted not in lost or
                                 wanted in self._rejoining):
        raise ValueError(f"island {wanted} already has a worker: "
                         f"{before.name}")
      num = hello.get("num_devices")
      if not isinstance(num, int) or num < 1:
        raise ValueError(f"worker reports {num!r} devices")
      if before is not None and num != before.num_devices:
        raise ValueError(
            f"island {wanted} had {before.num_devices} devices and its new "
            f"worker reports {num}: a worker taking a lost island's place "
            "must have as many (--devices)")
      platform = str(hello.get("platform", ""))
      others = {i.platform for i in self._islands.values() if i.id != wanted}
      if others and platform not in others:
        # The client lowers every program for one platform (InitResponse).
        raise ValueError(
            f"island {wanted}'s worker runs on {platform or '?'}, the "
            f"cluster's other islands on {', '.join(sorted(others))}: all "
            f"islands of a cluster have one platform (worker --platform)")
      memory = _bytes(hello, "memory_bytes", "memory")
      host_memory = _bytes(hello, "host_memory_bytes", "host memory")
      targets = _targets(hello.get("custom_call_targets"))
      sdy = hello.get("serialize_with_sdy", True)
      if not isinstance(sdy, bool):
        raise ValueError(f"worker reports serialize_with_sdy={sdy!r}")
      island = Island(IslandId(wanted), num, platform,
                      str(hello.get("device_kind", "")),
                      int(hello.get("pid", 0)), str(hello.get("host", "")),
                      str(hello.get("data_address", "")),
                      memory_bytes=memory, host_memory_bytes=host_memory,
                      transfer_address=str(hello.get("transfer_address") or ""),
                      custom_call_targets=targets, serialize_with_sdy=sdy)
      if before is not None:
        island.generation = before.generation + 1
        island.first_device = before.first_device
        self._rejoining[island.id] = before
      self._islands[island.id] = island
      self._device_islands = None
      if before is None and len(self._islands) == self.expected_islands:
        first = 0
        for i in sorted(self._islands):
          self._islands[i].first_device = DeviceId(first)
          first += self._islands[i].num_devices
      return island

  def connected(self, island: IslandId) -> None:
    """The island's worker is reachable through the dispatcher."""
    with self._mu:
      self._connected.add(island)
      self._rejoining.pop(IslandId(island), None)
      callbacks = self._when_complete if self.complete else []
      if callbacks:
        self._when_complete = []
    for callback in callbacks:
      callback()

  def abandon(self, island: Island) -> None:
    """`island`'s worker was registered but did not connect: its id is free
    again (a lost island's place goes back to the lost worker's record)."""
    with self._mu:
      if self._islands.get(island.id) is not island:
        return
      before = self._rejoining.pop(island.id, None)
      if before is not None:
        self._islands[island.id] = before
      elif island.id not in self._connected:
        del self._islands[island.id]
      self._device_islands = None

  @property
  def complete(self) -> bool:
    return len(self._connected) == self.expected_islands

  def when_complete(self, callback: Callable[[], None]) -> None:
    """Calls `callback` once every island has joined (now, if it has)."""
    with self._mu:
      if not self.complete:
        # Once each: a parked request asks again every time it is retried.
        if callback not in self._when_complete:
          self._when_complete.append(callback)
        return
    callback()

  def incomplete(self) -> StatusError:
    """What a request that needs every island is told while some are
    missing."""
    return StatusError(
        Code.UNAVAILABLE,
        f"only {len(self._connected)} of {self.expected_islands} island "
        "workers have joined the controller; start the missing workers "
        "(jax-pathways worker --controller ...)")

  def joining(self) -> set[IslandId]:
    """Lost islands whose new worker is registered but not yet connected."""
    with self._mu:
      return set(self._rejoining)

  def islands(self) -> list[Island]:
    with self._mu:
      return [self._islands[i] for i in sorted(self._islands)]

  def island(self, island: int) -> Island:
    with self._mu:
      if island not in self._islands:
        raise StatusError(Code.NOT_FOUND, f"island {island} does not exist")
      return self._islands[IslandId(island)]

  def num_devices(self) -> int:
    return sum(i.num_devices for i in self.islands())

  def island_of_device(self, device: int) -> Island:
    with self._mu:
      if self._device_islands is None:
        self._device_islands = {}
        for i in sorted(self._islands, reverse=True):  # the lowest wins
          for d in self._islands[i].device_ids:
            self._device_islands[d] = i
      found = self._device_islands.get(device)
      if found is not None:
        return self._islands[found]
    raise invalid_argument(
        f"device {device} does not exist; the cluster has devices "
        f"0..{self.num_devices() - 1}")

  def islands_of(self, devices: Iterable[int], what: str) -> list[Island]:
    """The islands holding `devices`, in island order."""
    devices = list(devices)
    if not devices:
      raise invalid_argument(f"{what} names no devices")
    ids = sorted({self.island_of_device(d).id for d in devices})
    return [self.island(i) for i in ids]

  @staticmethod
  def custom_call_targets(islands: Iterable[Island]) -> frozenset[str]:
    """The custom call targets programs on all of `islands` may name
    (programs/custom_calls.py): the kernels every one of them registers."""
    registered: frozenset[str] | None = None
    for island in islands:
      mine = (island.custom_call_targets
              if island.custom_call_targets is not None
              else custom_calls.registered(island.platform))
      registered = mine if registered is None else registered & mine
    return custom_calls.allowed(registered or ())

  def device_refs(self, devices: Iterable[int]) -> list[Any]:
    """How a worker names `devices`: island-local indices when they share
    one island, [island, local index] pairs when they span islands."""
    devices = list(devices)
    owners = [self.island_of_device(d) for d in devices]
    if len({o.id for o in owners}) == 1:
      return [o.local_index(d) for o, d in zip(owners, devices)]
    return [[int(o.id), o.local_index(d)] for o, d in zip(owners, devices)]


# What a worker may report of its kernels: names, a bounded number.
_MAX_TARGETS = 4096
_MAX_TARGET_NAME = 256


def _bytes(hello: dict[str, Any], key: str, what: str) -> int:
  """A hello's byte count `key` (0 if absent); raises ValueError to refuse."""
  count = hello.get(key, 0)
  if not isinstance(count, int) or count < 0:
    raise ValueError(f"worker reports {count!r} bytes of {what}")
  return count


def _targets(reported: Any) -> frozenset[str] | None:
  """A hello's custom_call_targets, checked; raises ValueError to refuse."""
  if reported is None:
    return None
  if (not isinstance(reported, list) or len(reported) > _MAX_TARGETS or
      not all(isinstance(t, str) and 0 < len(t) <= _MAX_TARGET_NAME
              for t in reported)):
    raise ValueError(f"worker reports custom call targets that are not up to "
                     f"{_MAX_TARGETS} names")
  return frozenset(reported)
