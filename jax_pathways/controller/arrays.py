"""Array: the controller's record of one client array.

The bytes live on the workers of `islands` (one island, or several for an
array that spans islands), under the same `buffer` id on each; the
controller keeps what it needs to place work on them. A request that could not produce its
arrays leaves Arrays with `error` set under the client's handles, so the
failure reaches the user at the next synchronous call, as IFRT specifies.
"""
from __future__ import annotations

import dataclasses
import math
from typing import AbstractSet

from jax_pathways import dtypes

from jax_pathways.programs.sharding import Sharding
from jax_pathways.resources.island import Island
from jax_pathways.resources.topology import Topology
from jax_pathways.status import (Status, StatusError, failed_precondition,
                                 invalid_argument)


@dataclasses.dataclass(eq=False)
class Buffer:
  """What Arrays sharing one buffer know together."""
  holders: int = 1            # Arrays not yet released
  donated: bool = False       # a launch consumed it
  # Buffers made of some of this one's device memory, or it of theirs (an
  # array assembled from single-device arrays, the shards split from an
  # array): as with PJRT's shared buffers, a launch that consumes one
  # consumes the others.
  shares: set["Buffer"] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class Array:
  buffer: int
  islands: tuple[Island, ...]
  dtype: str
  shape: tuple[int, ...]
  sharding: Sharding | None
  deleted: bool = False       # deleted by the client: no longer usable
  released: bool = False      # it no longer holds its buffer
  error: Status | None = None
  shared: Buffer = dataclasses.field(default_factory=Buffer)

  @classmethod
  def failed(cls, status: Status) -> "Array":
    return cls(0, (), "", (), None, error=status)

  def alias(self, sharding: Sharding | None) -> "Array":
    """Another Array on the same buffer (the same bytes, e.g. a one-shard
    array assembled from its only shard): no worker op needed."""
    self.shared.holders += 1
    return Array(self.buffer, self.islands, self.dtype, self.shape, sharding,
                 shared=self.shared)

  def shares_memory_with(self, other: "Array") -> None:
    """`other` holds some of this array's device memory, or it of other's."""
    if other.shared is not self.shared:
      self.shared.shares.add(other.shared)
      other.shared.shares.add(self.shared)

  def donate(self) -> None:
    """A launch consumes the buffer: every Array on it, or sharing some of
    its memory, is unusable."""
    self.shared.donated = True
    for other in self.shared.shares:
      other.donated = True

  def release(self) -> bool:
    """Lets go of the buffer; True if it was the last holder (free it)."""
    if self.released:
      return False
    self.released = True
    self.shared.holders -= 1
    if self.shared.holders:
      return False
    for other in self.shared.shares:
      other.shares.discard(self.shared)
    self.shared.shares.clear()
    return True

  def device_bytes(self) -> dict[int, int]:
    """Bytes it takes on each device holding it."""
    if self.sharding is None:
      return {}
    return device_bytes(self.dtype, self.shape, self.sharding)

  def island_bytes(self, topology: Topology) -> dict[int, int]:
    """Bytes it takes on each island holding it."""
    if self.sharding is None:
      return {}
    return island_bytes(self.dtype, self.shape, self.sharding, topology)

  def check_usable(self) -> None:
    """Raises the error a request using this array should fail with."""
    if self.error is not None:
      raise StatusError(self.error.code, self.error.message)
    if self.deleted or self.shared.donated:
      raise failed_precondition("Array has been deleted.")

  def check_fits(self, i: int, devices: AbstractSet[int],
                 parameter: tuple[tuple[int, ...], str] | None,
                 sharding: Sharding | None) -> None:
    """This array is what argument `i` of an Execute takes: on the
    program's `devices`, of its `parameter`'s shape and dtype, in shards of
    the shape its `sharding` makes (each where known). PJRT trusts what it
    is given."""
    if self.sharding is None or frozenset(self.sharding.devices) != devices:
      got = [] if self.sharding is None else sorted(self.sharding.devices)
      raise invalid_argument(
          f"Execute: argument {i} is on devices {got} but the program runs "
          f"on devices {sorted(devices)}; put it there with jax.device_put "
          "first")
    if parameter is None:
      return
    shape, dtype = parameter
    if (self.shape, self.dtype) != (shape, dtype):
      raise invalid_argument(
          f"Execute: argument {i} is {self.dtype}{list(self.shape)} but the "
          f"program takes {dtype}{list(shape)}")
    if sharding is None:
      return
    got, want = self.sharding.shard_shape(shape), sharding.shard_shape(shape)
    if got != want:
      raise invalid_argument(
          f"Execute: argument {i} comes in shards of {list(got)} but the "
          f"program takes shards of {list(want)}; reshard it first")


def device_bytes(dtype: str, shape: tuple[int, ...], sharding: Sharding
                 ) -> dict[int, int]:
  """Bytes an array of this layout takes on each of its devices."""
  size = math.prod(sharding.shard_shape(shape)) * dtypes.itemsize(dtype)
  return {d: size for d in sharding.devices}


def island_bytes(dtype: str, shape: tuple[int, ...], sharding: Sharding,
                 topology: Topology) -> dict[int, int]:
  """... and on each island (what a worker's memory budget counts)."""
  out: dict[int, int] = {}
  for device, size in device_bytes(dtype, shape, sharding).items():
    island = int(topology.island_of_device(device).id)
    out[island] = out.get(island, 0) + size
  return out
