"""Sharding: how an array or program output is laid over global devices.

The controller's own form of IFRT's sharding protos: the IFRT device list
(global ids, in order) plus an optional xla.OpSharding; None means every device
holds the whole array. It converts from and to the ShardingProto the client
speaks and to the island-local spec a worker builds a jax sharding from.
"""
from __future__ import annotations

import base64
import dataclasses
import functools
import math
from typing import Any, Sequence

import numpy as np

from jax_pathways.resources.topology import Topology
from jax_pathways.status import invalid_argument, unimplemented
from jax_pathways.wire import protos

SINGLE_DEVICE = "xla::ifrt::SingleDeviceSharding"
HLO = "xla::ifrt::HloSharding"
CONCRETE_EVEN = "xla::ifrt::ConcreteEvenSharding"

_REPLICATED = 0
_MAXIMAL = 1
_TILED = 3  # OpSharding.Type.OTHER


@dataclasses.dataclass(frozen=True)
class Sharding:
  devices: tuple[int, ...]
  op_sharding: bytes | None = None  # serialized xla.OpSharding
  memory_kind: str | None = None

  @property
  def num_shards(self) -> int:
    """Shards IFRT enumerates: one per device, replicated or not."""
    return len(self.devices)

  def with_devices(self, devices: Sequence[int],
                   memory_kind: str | None = None) -> "Sharding":
    if len(devices) != len(self.devices):
      raise invalid_argument(
          f"cannot move an array sharded over {len(self.devices)} devices "
          f"onto {len(devices)} devices")
    return Sharding(tuple(devices), self.op_sharding,
                    memory_kind if memory_kind is not None else self.memory_kind)

  def maximal_device(self) -> int | None:
    """The position of the one device that holds a maximal array whole
    (None for any other sharding)."""
    if self.op_sharding is None:
      return None
    op = protos.msg("xla.OpSharding").FromString(self.op_sharding)
    if op.type != _MAXIMAL or len(op.tile_assignment_devices) != 1:
      return None
    position = int(op.tile_assignment_devices[0])
    return position if 0 <= position < len(self.devices) else None

  def shard_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
    """The shape of each shard (IFRT shardings here are even or padded)."""
    tiles = None if self.op_sharding is None else _tiles(self.op_sharding)
    if tiles is None:
      return tuple(shape)
    return tuple(math.ceil(d / t) for d, t in zip(shape, tiles))

  def check(self, rank: int, field: str) -> None:
    """Fits an array of `rank` dimensions: distinct devices, and tiles (if
    any) that cover every dimension and number exactly those devices."""
    if len(set(self.devices)) != len(self.devices):
      raise invalid_argument(f"{field}: sharding names a device more than "
                             f"once: {list(self.devices)}")
    if self.op_sharding is None:
      return
    op = protos.msg("xla.OpSharding").FromString(self.op_sharding)
    if op.type != _TILED:
      return
    tiles = list(op.tile_assignment_dimensions)
    n = len(self.devices)
    if (len(tiles) < rank or any(t < 1 for t in tiles) or
        math.prod(tiles) != n or
        any(not 0 <= d < n for d in op.tile_assignment_devices)):
      raise invalid_argument(
          f"{field}: tile assignment {tiles} (devices "
          f"{list(op.tile_assignment_devices)}) does not tile a rank-{rank} "
          f"array over the sharding's {n} devices")

  def reordered(self, devices: Sequence[int], order: Sequence[int]
                ) -> "Sharding":
    """The same layout with its shards moved to `devices`, the shard at
    position p to position order[p] (a remap that reorders an array's
    devices: each device keeps the piece it holds)."""
    if self.op_sharding is None:
      return Sharding(tuple(devices), None, self.memory_kind)
    op = protos.msg("xla.OpSharding").FromString(self.op_sharding)
    positions = _tile_devices(op, len(order))
    if any(not 0 <= p < len(order) for p in positions):
      raise invalid_argument(
          f"tile assignment {positions} names devices outside the "
          f"sharding's {len(order)}")
    del op.iota_reshape_dims[:]
    del op.iota_transpose_perm[:]
    op.tile_assignment_devices[:] = [order[p] for p in positions]
    return Sharding(tuple(devices), op.SerializeToString(), self.memory_kind)

  def worker_spec(self, topology: Topology) -> dict[str, Any]:
    """The form a worker builds a jax sharding from (Topology.device_refs)."""
    return {
        "devices": topology.device_refs(self.devices),
        "op_sharding": (None if self.op_sharding is None else
                        base64.b64encode(self.op_sharding).decode()),
        "memory_kind": self.memory_kind,
    }


def from_proto(proto: Any) -> Sharding:
  """xla.ifrt.ShardingProto -> Sharding."""
  ser = proto.serialized_sharding
  kind = ser.type_name
  if kind == SINGLE_DEVICE:
    p = protos.msg("xla.ifrt.SingleDeviceShardingProto").FromString(ser.data)
    return Sharding((p.device_id,), None, _memory_kind(p))
  if kind == HLO:
    p = protos.msg("xla.ifrt.HloShardingProto").FromString(ser.data)
    op = p.xla_op_sharding
    whole = op.type == _REPLICATED or (op.type == _MAXIMAL and
                                       len(p.devices.device_ids) == 1)
    return Sharding(tuple(p.devices.device_ids),
                    None if whole else op.SerializeToString(), _memory_kind(p))
  if kind == CONCRETE_EVEN:
    p = protos.msg("xla.ifrt.ConcreteEvenShardingProto").FromString(ser.data)
    if p.is_fully_replicated or len(p.devices.device_ids) == 1:
      return Sharding(tuple(p.devices.device_ids), None, _memory_kind(p))
    raise unimplemented(
        "ConcreteEvenSharding that is not fully replicated is not supported; "
        "use a NamedSharding")
  if not kind:
    raise invalid_argument("request carries no sharding")
  raise unimplemented(f"sharding type {kind} is not supported by jax_pathways")


def to_proto(sharding: Sharding, out: Any) -> None:
  """Writes `sharding` into an xla.ifrt.ShardingProto (`out`)."""
  ser = out.serialized_sharding
  if len(sharding.devices) == 1 and sharding.op_sharding is None:
    p = protos.msg("xla.ifrt.SingleDeviceShardingProto")(
        device_id=sharding.devices[0])
    ser.type_name = SINGLE_DEVICE
  else:
    p = protos.msg("xla.ifrt.HloShardingProto")()
    p.devices.device_ids.extend(sharding.devices)
    if sharding.op_sharding is not None:
      p.xla_op_sharding.ParseFromString(sharding.op_sharding)
    else:
      p.xla_op_sharding.type = _REPLICATED
    ser.type_name = HLO
  if sharding.memory_kind is not None:
    p.memory_kind = sharding.memory_kind
  ser.data = p.SerializeToString()


def from_op_sharding(devices: Sequence[int], op_sharding_b64: str | None,
                     memory_kind: str | None) -> Sharding:
  """From the (base64) OpSharding a worker reports for a program output."""
  raw = None
  if op_sharding_b64 is not None:
    raw = base64.b64decode(op_sharding_b64)
    if protos.msg("xla.OpSharding").FromString(raw).type == _REPLICATED:
      raw = None
  return Sharding(tuple(devices), raw, memory_kind)


@functools.lru_cache(maxsize=1024)
def _tiles(op_sharding: bytes) -> tuple[int, ...] | None:
  """Tiles per dimension of a tiled OpSharding, None for any other kind.
  Cached: Execute checks every argument's shard shape."""
  op = protos.msg("xla.OpSharding").FromString(op_sharding)
  if op.type != _TILED:
    return None
  return tuple(op.tile_assignment_dimensions)


def _tile_devices(op: Any, n: int) -> list[int]:
  """The device position (of n) of each tile, whether listed or given as an
  iota (reshape, then transpose)."""
  if op.tile_assignment_devices or not op.iota_reshape_dims:
    return list(op.tile_assignment_devices)
  dims = list(op.iota_reshape_dims)
  perm = list(op.iota_transpose_perm) or list(range(len(dims)))
  if (sorted(perm) != list(range(len(dims))) or any(d < 1 for d in dims) or
      math.prod(dims) != math.prod(op.tile_assignment_dimensions) or
      math.prod(dims) > n):
    raise invalid_argument(
        f"tile assignment iota {dims} transposed {perm} does not fit tiles "
        f"{list(op.tile_assignment_dimensions)}")
  return [int(d) for d in
          np.arange(math.prod(dims)).reshape(dims).transpose(perm).ravel()]


def _memory_kind(p: Any) -> str | None:
  return p.memory_kind if p.HasField("memory_kind") else None
