"""RemapPlan: IFRT's plan for RemapArrays, read and checked against the
arrays it names.

A remap makes arrays out of other arrays' shards without moving a byte:
every output shard IS an input shard, on the same device (see
xla/python/ifrt/remap_plan.h). Each mapping pairs intervals [start:end:step]
of one input's shard positions with as many positions of one output. All of
it comes from the client: it is checked as IFRT's RemapPlan::Validate checks
it, and against the arrays themselves; a bad field is INVALID_ARGUMENT
naming it, before anything changes.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from jax_pathways import dtypes, validation
from jax_pathways.controller.arrays import Array
from jax_pathways.programs import sharding as sharding_lib
from jax_pathways.programs.sharding import Sharding
from jax_pathways.resources.virtual_slice import VirtualSlice
from jax_pathways.status import StatusError, invalid_argument, unimplemented
from jax_pathways.wire import protos

# xla.ifrt.proto.ArrayCopySemantics: the two a remap may be asked for.
REUSE_INPUT = 2
DONATE_INPUT = 3
# What a sharding without a memory kind means (the clients send both forms).
_DEFAULT_MEMORY = "device"


@dataclasses.dataclass(frozen=True)
class Output:
  """One array the remap makes: the input shard behind each of its shard
  positions, as (input index, position in that input's devices)."""
  dtype: str
  shape: tuple[int, ...]
  sharding: Sharding
  pieces: tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True)
class _Spec:
  """An ArraySpecProto on physical devices. `sharding` is None for a
  ConcreteEvenSharding that is not fully replicated: it says each device
  holds a shard of `shard_shape`, not which one."""
  dtype: str
  shape: tuple[int, ...]
  devices: tuple[int, ...]
  memory_kind: str
  shard_shape: tuple[int, ...]
  sharding: Sharding | None
  layout: bytes


def _physical(slice_: VirtualSlice, ids: Sequence[int], field: str
              ) -> tuple[int, ...]:
  try:
    return slice_.physical(ids)
  except StatusError as e:
    raise invalid_argument(f"{field}: {e.status.message}") from None


def _spec(proto: Any, slice_: VirtualSlice, field: str) -> _Spec:
  if proto.version_number != 0:
    raise invalid_argument(f"{field}.version_number {proto.version_number} "
                           "is not supported (only 0)")
  dtype = dtypes.name_of(proto.dtype)
  shape = validation.check_shape(proto.shape.dims, dtypes.itemsize(dtype),
                                 field)
  ser = proto.sharding.serialized_sharding
  if ser.type_name == sharding_lib.CONCRETE_EVEN:
    p = protos.msg("xla.ifrt.ConcreteEvenShardingProto").FromString(ser.data)
    if not p.is_fully_replicated and len(p.devices.device_ids) > 1:
      devices = _physical(slice_, p.devices.device_ids, f"{field}.sharding")
      shard_shape = tuple(p.shard_shape.dims)
      if (tuple(p.shape.dims) != shape or len(shard_shape) != len(shape) or
          any(not 0 <= s <= d for s, d in zip(shard_shape, shape))):
        raise invalid_argument(
            f"{field}.sharding: shards of {list(shard_shape)} of an array "
            f"of {list(p.shape.dims)} do not fit the spec's "
            f"{list(shape)}")
      kind = p.memory_kind if p.HasField("memory_kind") else None
      validation.check_distinct(devices, f"{field}.sharding")
      return _Spec(dtype, shape, devices, kind or _DEFAULT_MEMORY,
                   shard_shape, None, proto.layout)
  try:
    sharding = slice_.physical_sharding(sharding_lib.from_proto(
        proto.sharding))
  except StatusError as e:
    raise StatusError(e.status.code,
                      f"{field}.sharding: {e.status.message}") from None
  sharding.check(len(shape), f"{field}.sharding")
  return _Spec(dtype, shape, sharding.devices,
               sharding.memory_kind or _DEFAULT_MEMORY,
               sharding.shard_shape(shape), sharding, proto.layout)


def _check_input(spec: _Spec, array: Array, field: str) -> None:
  """The array is the one the spec describes (IFRT checks dtype, shape,
  devices and memory kind, not the partitioning: remaps reinterpret it)."""
  assert array.sharding is not None  # usable arrays have one
  if (spec.dtype, spec.shape) != (array.dtype, array.shape):
    raise invalid_argument(
        f"{field} is {spec.dtype}{list(spec.shape)} but the array is "
        f"{array.dtype}{list(array.shape)}")
  real = array.sharding.shard_shape(array.shape)
  if spec.shard_shape != real:
    raise invalid_argument(f"{field} has shards of {list(spec.shard_shape)} "
                           f"but the array's are {list(real)}")
  kind = array.sharding.memory_kind or _DEFAULT_MEMORY
  if (spec.devices, spec.memory_kind) != (array.sharding.devices, kind):
    raise invalid_argument(
        f"{field} is on devices {list(spec.devices)} ({spec.memory_kind}) "
        f"but the array is on {list(array.sharding.devices)} ({kind})")


def _positions(start: int, end: int, step: int, shards: int, field: str
               ) -> range:
  """Shard positions of one interval; bounds as IFRT's CheckRange."""
  if not 0 <= start < shards:
    raise invalid_argument(f"{field} start {start} is not in [0, "
                           f"{shards - 1}]")
  if step <= 0:
    raise invalid_argument(f"{field} step {step} is not positive")
  if not 0 <= end <= shards + step - 1:
    raise invalid_argument(f"{field} end {end} is not in [0, "
                           f"{shards + step - 1}] for step {step}")
  return range(start, min(end, shards), step)


def parse(req: Any, arrays: Sequence[Array], slice_: VirtualSlice
          ) -> list[Output]:
  """The outputs of RemapArraysRequest `req` on the (usable) `arrays` it
  names; raises INVALID_ARGUMENT naming the first bad field."""
  plan = req.plan
  if plan.version_number != 0:
    raise invalid_argument(f"plan.version_number {plan.version_number} is "
                           "not supported (only 0)")
  if not plan.input_specs:
    raise invalid_argument("plan.input_specs: a remap needs an input")
  if len(plan.input_specs) != len(arrays):
    raise invalid_argument(
        f"plan.input_specs describe {len(plan.input_specs)} arrays but "
        f"array_handles name {len(arrays)}")
  if len(plan.output_specs) != len(req.result_handles):
    raise invalid_argument(
        f"plan.output_specs describe {len(plan.output_specs)} arrays but "
        f"result_handles name {len(req.result_handles)}")
  ins = [_spec(p, slice_, f"plan.input_specs[{i}]")
         for i, p in enumerate(plan.input_specs)]
  for i, (spec, array) in enumerate(zip(ins, arrays)):
    _check_input(spec, array, f"plan.input_specs[{i}]")
  outs = [_spec(p, slice_, f"plan.output_specs[{i}]")
          for i, p in enumerate(plan.output_specs)]
  if not plan.mappings:
    raise invalid_argument("plan.mappings: a remap needs a mapping")

  used = [[False] * len(s.devices) for s in ins]
  pieces: list[list[tuple[int, int] | None]] = [
      [None] * len(s.devices) for s in outs]
  feeds: dict[int, dict[int, set[int]]] = {}  # out -> in -> devices
  for k, m in enumerate(plan.mappings):
    field = f"plan.mappings[{k}]"
    if not 0 <= m.in_array < len(ins):
      raise invalid_argument(f"{field}.in_array {m.in_array} is not in "
                             f"[0, {len(ins) - 1}]")
    if not 0 <= m.out_array < len(outs):
      raise invalid_argument(f"{field}.out_array {m.out_array} is not in "
                             f"[0, {len(outs) - 1}]")
    intervals = (m.from_start, m.from_end, m.from_step,
                 m.to_start, m.to_end, m.to_step)
    if len({len(v) for v in intervals}) != 1:
      raise invalid_argument(
          f"{field}: from_start/end/step and to_start/end/step must be "
          f"equally long, not {[len(v) for v in intervals]}")
    src, dst = ins[m.in_array], outs[m.out_array]
    if src.dtype != dst.dtype:
      raise invalid_argument(f"{field}: input {m.in_array} is {src.dtype} "
                             f"but output {m.out_array} is {dst.dtype}")
    if src.layout != dst.layout:
      raise invalid_argument(f"{field}: input {m.in_array} and output "
                             f"{m.out_array} have different layouts")
    if src.shard_shape != dst.shard_shape:
      raise invalid_argument(
          f"{field}: input {m.in_array} has shards of "
          f"{list(src.shard_shape)} but output {m.out_array} has shards of "
          f"{list(dst.shard_shape)}")
    if src.memory_kind != dst.memory_kind:
      raise invalid_argument(
          f"{field}: input {m.in_array} is in {src.memory_kind} memory but "
          f"output {m.out_array} in {dst.memory_kind}")
    fed = feeds.setdefault(m.out_array, {}).setdefault(m.in_array, set())
    for s, (fs, fe, fst, ts, te, tst) in enumerate(zip(*intervals)):
      froms = _positions(fs, fe, fst, len(src.devices), f"{field}.from[{s}]")
      tos = _positions(ts, te, tst, len(dst.devices), f"{field}.to[{s}]")
      if len(froms) != len(tos):
        raise invalid_argument(
            f"{field}: from[{s}] has {len(froms)} shards but to[{s}] "
            f"has {len(tos)}")
      for p, q in zip(froms, tos):
        if used[m.in_array][p]:
          raise invalid_argument(f"{field}: input {m.in_array} shard {p} "
                                 "is used more than once")
        if pieces[m.out_array][q] is not None:
          raise invalid_argument(f"{field}: output {m.out_array} shard {q} "
                                 "is assigned more than once")
        if src.devices[p] != dst.devices[q]:
          raise invalid_argument(
              f"{field}: input {m.in_array} shard {p} is on device "
              f"{src.devices[p]} but output {m.out_array} shard {q} on "
              f"{dst.devices[q]}: a remap moves no data")
        used[m.in_array][p] = True
        pieces[m.out_array][q] = (m.in_array, p)
        fed.add(src.devices[p])
  complete: list[tuple[tuple[int, int], ...]] = []
  for o, shards in enumerate(pieces):
    if None in shards:
      raise invalid_argument(f"plan: output {o} shard {shards.index(None)} "
                             "is assigned by no mapping")
    complete.append(tuple(p for p in shards if p is not None))
  _check_input_devices_for_output(plan, feeds, slice_)
  _check_copy_semantics(req, feeds)
  return [Output(spec.dtype, spec.shape,
                 _output_sharding(spec, shards, arrays, o), shards)
          for o, (spec, shards) in enumerate(zip(outs, complete))]


def _check_input_devices_for_output(plan: Any,
                                    feeds: dict[int, dict[int, set[int]]],
                                    slice_: VirtualSlice) -> None:
  """The optional summary (output -> the devices of each input it takes)
  agrees with the mappings."""
  seen: set[int] = set()
  for k, entry in enumerate(plan.input_devices_for_output):
    field = f"plan.input_devices_for_output[{k}]"
    if entry.out_array in seen or entry.out_array not in feeds:
      raise invalid_argument(f"{field}: output {entry.out_array} is repeated "
                             "or fed by no mapping")
    seen.add(entry.out_array)
    listed: dict[int, set[int]] = {}
    for r in entry.input_devices:
      if r.in_array in listed:
        raise invalid_argument(f"{field}: input {r.in_array} is repeated")
      listed[r.in_array] = set(_physical(slice_, r.device_list.device_ids,
                                         field))
    if listed != feeds[entry.out_array]:
      raise invalid_argument(f"{field}: its inputs and devices differ from "
                             "those the mappings give the output")


def _check_copy_semantics(req: Any, feeds: dict[int, dict[int, set[int]]]
                          ) -> None:
  if req.copy_semantics not in (REUSE_INPUT, DONATE_INPUT):
    raise invalid_argument(
        f"copy_semantics {req.copy_semantics}: a remap reuses or donates its "
        "inputs (REUSE_INPUT or DONATE_INPUT), it never copies")
  if (req.copy_semantics == REUSE_INPUT and
      any(len(ins) > 1 for ins in feeds.values())):
    raise invalid_argument(
        "copy_semantics: an output made of several inputs needs "
        "DONATE_INPUT")
  if (req.copy_semantics == DONATE_INPUT and
      len(set(req.array_handles)) != len(req.array_handles)):
    raise invalid_argument("array_handles: an array donated twice")


def _output_sharding(spec: _Spec, pieces: Sequence[tuple[int, int]],
                     arrays: Sequence[Array], o: int) -> Sharding:
  """The output's sharding; for a ConcreteEvenSharding, the layout of the
  one input it reorders (JAX's device_put to another device order), each
  device keeping its piece."""
  if spec.sharding is not None:
    return spec.sharding
  sources = {a for a, _ in pieces}
  source = arrays[min(sources)]
  assert source.sharding is not None
  if (len(sources) != 1 or source.shape != spec.shape or
      len(pieces) != len(source.sharding.devices)):
    raise unimplemented(
        f"RemapArrays: output {o} has a ConcreteEvenSharding that is not a "
        "reordering of one whole input; give it an HloSharding")
  order = [0] * len(pieces)
  for q, (_, p) in enumerate(pieces):
    order[p] = q
  sharding = source.sharding.reordered(spec.devices, order)
  if sharding.shard_shape(spec.shape) != spec.shard_shape:
    raise invalid_argument(
        f"plan.output_specs[{o}].sharding: shards of "
        f"{list(spec.shard_shape)}, but input {min(sources)} has shards of "
        f"{list(sharding.shard_shape(spec.shape))}")
  return sharding
