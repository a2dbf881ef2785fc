"""VirtualSlice: the devices one client sees, and the physical ones behind them.

A client's devices are numbered 0..n-1 whatever physical devices the
resource manager gave it; every device id crossing the session boundary is
translated here, in (physical) and out (virtual), so the rest of the
controller speaks physical ids only and two clients on the same devices
share compiled programs.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Sequence

from jax_pathways.programs.sharding import Sharding
from jax_pathways.status import invalid_argument


@dataclasses.dataclass(frozen=True)
class SliceRequest:
  """What a client asked for: a device count or a mesh shape (their product),
  optionally on one island. Nothing asked: the whole cluster."""
  devices: int | None = None
  mesh: tuple[int, ...] | None = None
  island: int | None = None

  @classmethod
  def parse(cls, devices: str | None, island: str | None) -> "SliceRequest":
    """From the session's initialization data: devices "4" or "2x4",
    island "1" (the client's initialize(devices=..., island=...))."""
    mesh = None
    count = None
    if devices:
      if not re.fullmatch(r"\d+(x\d+)*", devices.strip()):
        raise invalid_argument(
            f"devices={devices!r}: ask for a count (4) or a mesh shape "
            "(2x4)")
      dims = tuple(int(d) for d in devices.strip().split("x"))
      if 0 in dims:
        raise invalid_argument(f"devices={devices!r} asks for no devices")
      count = math.prod(dims)
      mesh = dims if len(dims) > 1 else None
    where = None
    if island:
      if not island.strip().isdigit():
        raise invalid_argument(f"island={island!r} is not an island number")
      where = int(island)
    return cls(count, mesh, where)

  def describe(self) -> str:
    if self.devices is None:
      what = "all devices"
    elif self.mesh:
      what = "a " + "x".join(map(str, self.mesh)) + " mesh"
    else:
      what = f"{self.devices} devices"
    return what + (f" on island {self.island}" if self.island is not None
                   else "")


@dataclasses.dataclass(frozen=True)
class VirtualSlice:
  physical_ids: tuple[int, ...]  # virtual device i is physical_ids[i]
  request: SliceRequest = SliceRequest()

  @property
  def size(self) -> int:
    return len(self.physical_ids)

  def physical(self, ids: Sequence[int]) -> tuple[int, ...]:
    for i in ids:
      if not 0 <= i < len(self.physical_ids):
        raise invalid_argument(
            f"device {i} is not in this client's slice: it has devices "
            f"0..{len(self.physical_ids) - 1}")
    return tuple(self.physical_ids[i] for i in ids)

  def virtual(self, ids: Sequence[int]) -> tuple[int, ...]:
    index = {p: v for v, p in enumerate(self.physical_ids)}
    return tuple(index[i] for i in ids)

  def physical_sharding(self, sharding: Sharding) -> Sharding:
    return sharding.with_devices(self.physical(sharding.devices))

  def virtual_sharding(self, sharding: Sharding) -> Sharding:
    return sharding.with_devices(self.virtual(sharding.devices))
