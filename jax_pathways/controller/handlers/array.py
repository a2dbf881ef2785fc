"""Array requests: uploads, downloads, copies, reshards, remaps and deletion.

Each request becomes ops on the islands that hold the array (one island, or
several for an array that spans islands, under the same buffer id on each),
submitted as one gang; copies and reshards are moves (moves.py). Requests
that create arrays register them under the client's handles before
returning, even though the ops run later.
"""
from __future__ import annotations

import collections
import math
from typing import Any, Sequence

from jax_pathways import dtypes, validation
from jax_pathways.controller import moves, op_payloads, remap_plan
from jax_pathways.controller.arrays import Array
from jax_pathways.controller.dispatcher import IslandOp, OpKind, StageDest
from jax_pathways.controller.handlers.future import new_done_future
from jax_pathways.controller.handlers.handler_table import handles
from jax_pathways.controller.session import Reply, Session, StreamTo
from jax_pathways.programs import sharding as sharding_lib
from jax_pathways.programs.sharding import Sharding
from jax_pathways.resources.island import Island
from jax_pathways.resources.topology import Topology
from jax_pathways.status import (Code, Status, StatusError, from_exception,
                                 invalid_argument, unimplemented)
from jax_pathways.wire import payloads

_PJRT_LAYOUT = "xla::ifrt::PjRtLayout"
# Uploads larger than this stream to their workers as they arrive (JAX's
# client sends 1 MiB chunks: a smaller one arrives in one piece).
STREAM_MIN_BYTES = 1 << 20
_ERROR_CODES = frozenset(int(c) for c in Code if c != Code.OK)


def _usable(session: Session, handle: int) -> Array:
  array = session.arrays.get(handle)
  array.check_usable()
  return array


def _sharding(session: Session, proto: Any) -> Sharding:
  """A ShardingProto of the client's (virtual) devices, on physical ones."""
  return session.slice.physical_sharding(sharding_lib.from_proto(proto))


def _islands(session: Session, sharding: Sharding, what: str
             ) -> tuple[Island, ...]:
  islands = session.services.topology.islands_of(sharding.devices, what)
  if len(islands) > 1 and not session.services.spmd_across_islands:
    raise unimplemented(
        f"{what} spans islands {[i.id for i in islands]} but this cluster "
        "keeps arrays within one island")
  return tuple(islands)


def _check_layout(req: Any, rank: int) -> None:
  """Only the default (row-major) layout is supported."""
  if not req.HasField("layout"):
    return
  from jax_pathways.wire import protos  # pylint: disable=import-outside-toplevel
  ser = req.layout.serialized_layout
  if ser.type_name == _PJRT_LAYOUT:
    layout = protos.msg("xla.ifrt.PjRtLayoutProto").FromString(ser.data)
    if list(layout.xla_layout.minor_to_major) in ([], list(range(rank))[::-1]):
      return
  elif not ser.type_name:
    return
  raise unimplemented("arrays with a custom layout are not supported")


def _strides(req: Any) -> list[int] | None:
  if req.HasField("byte_strides"):
    return list(req.byte_strides.strides)
  return None


def _shape(dims: Sequence[int], dtype: str, field: str) -> tuple[int, ...]:
  return validation.check_shape(dims, dtypes.itemsize(dtype), field)


def _check_upload(data: Any, shape: Sequence[int], dtype: str,
                  strides: list[int] | None, field: str) -> None:
  """The upload holds the array it is declared to: the worker maps it with
  these strides, so nothing may point outside its bytes. (Strings come as
  IFRT's serialized contents, whose strings the worker counts.)"""
  if dtype == dtypes.STRING:
    if strides is not None:
      raise invalid_argument(f"{field}: a string array takes no strides")
    return
  validation.check_host_buffer(shape, dtypes.itemsize(dtype), strides,
                               payloads.nbytes(data), field)


def _new_array(session: Session, handle: int, islands: tuple[Island, ...],
               dtype: str, shape: Sequence[int], sharding: Sharding) -> Array:
  buffer = session.services.dispatcher.new_buffers(1)[0]
  array = Array(buffer, islands, dtype, tuple(shape), sharding)
  session.arrays.put(handle, array)
  return array


@handles("make_array_from_host_buffer_request",
         results=lambda r: [r.array_handle] if r.HasField("array_handle") else [])
def make_array_from_host_buffer(session: Session, req: Any,
                                reply: Reply) -> None:
  if not req.HasField("array_handle"):
    raise invalid_argument("MakeArrayFromHostBuffer without an array_handle "
                           "(protocol versions below 10 are not supported)")
  epoch = session.services.dispatcher.epoch  # before placing it
  data = session.take_upload(req.host_buffer_handle,
                             lambda: _stream_to(session, req))
  dtype = dtypes.name_of(req.dtype, strings=True)
  shape = _shape(req.shape.dims, dtype, "MakeArrayFromHostBuffer")
  _check_upload(data, shape, dtype, _strides(req), "MakeArrayFromHostBuffer")
  _check_layout(req, len(shape))
  sharding, islands = _placement(session, req, shape)
  array = _new_array(session, req.array_handle, islands, dtype, shape,
                     sharding)
  # Every island gets the whole buffer and keeps its own shards.
  payload = payloads.parts({
      "dtype": dtype, "shape": list(shape), "strides": _strides(req),
      "sharding": sharding.worker_spec(session.services.topology)}, data)
  sizes = array.island_bytes(session.services.topology)
  stage = session.staged_put([req.host_buffer_handle])
  session.services.dispatcher.submit(
      [IslandOp(i.id, OpKind.PUT, results=[array.buffer], payload=payload,
                result_bytes=[sizes[i.id]], stage=stage)
       for i in islands])
  if dtype != dtypes.STRING:  # (their uploads' sizes vary)
    _plan_uploads(session, req.array_handle, [payloads.nbytes(data)],
                  [(array, [(i.id, payload[0], [(b"", 0)]) for i in islands])],
                  epoch)
  reply.ok(lambda r: setattr(r, "array_handle", req.array_handle))


# One island's PUT of an upload, for the fast path: (island, payload head,
# its blobs: [(padding before it, which of the request's uploads)]).
_PlannedPut = tuple[int, bytes, list[tuple[bytes, int]]]


def _plan_uploads(session: Session, first_handle: int,
                  upload_bytes: list[int],
                  arrays: list[tuple[Array, list[_PlannedPut]]],
                  epoch: int) -> None:
  """Hands the fast path what this upload request made, so that the ones
  alike (but for their handles) are C++'s from now on."""
  fast = session.services.fast_path
  if fast is None:
    return
  layouts = session.arrays.layouts
  planned = []
  for array, puts in arrays:
    layout = layouts.of_array(array)
    sizes = array.island_bytes(session.services.topology)
    planned.append((layout, layouts.plan(layout),
                    [(island, sizes[island], head, blobs)
                     for island, head, blobs in puts]))
  fast.register_upload(session.stream, first_handle, upload_bytes, planned,
                       epoch)


def _stream_to(session: Session, req: Any
               ) -> tuple[int, list[StageDest]] | None:
  """Where an upload still arriving may stream (every island of the array
  gets it whole, as its PUT's tails), if it is large enough for the
  overlap to pay (more than one of the client's chunks) and the request
  is well-formed so far; else None (its errors come once it has arrived)."""
  field = "MakeArrayFromHostBuffer"
  try:
    dtype = dtypes.name_of(req.dtype)
    shape = _shape(req.shape.dims, dtype, field)
    nbytes = math.prod(shape) * dtypes.itemsize(dtype)
    if not _streams(nbytes, shape, dtype, [_strides(req)], field):
      return None
    _, islands = _placement(session, req, shape)
  except StatusError:
    return None
  return (session.services.dispatcher.new_stage(),
          [StageDest(i.id, nbytes) for i in islands])


def _streams(nbytes: int, shape: Sequence[int], dtype: str,
             strides: Sequence[list[int] | None], field: str) -> bool:
  """Whether uploads of `nbytes` in all, each of `shape` with one of
  `strides`, stream while they arrive: if the overlap pays (more than one
  of the client's chunks), and only dense ones (else an upload's size is
  told only by the upload). Raises StatusError for strides that are not."""
  if nbytes <= STREAM_MIN_BYTES:
    return False
  for s in strides:
    validation.check_dense_strides(shape, dtypes.itemsize(dtype), s, field)
  return True


def _placement(session: Session, req: Any, shape: Sequence[int]
               ) -> tuple[Sharding, tuple[Island, ...]]:
  """A MakeArrayFromHostBuffer's sharding and the islands it spans."""
  sharding = _sharding(session, req.sharding)
  sharding.check(len(shape), "MakeArrayFromHostBuffer")
  return sharding, _islands(session, sharding, "the array")


@handles("make_arrays_from_host_buffer_shards_request",
         results=lambda r: list(r.array_handles))
def make_arrays_from_host_buffer_shards(session: Session, req: Any,
                                        reply: Reply) -> None:
  if len(req.array_handles) != len(req.specs):
    raise invalid_argument(f"{len(req.specs)} specs for "
                           f"{len(req.array_handles)} array handles")
  epoch = session.services.dispatcher.epoch  # before placing them
  # Every upload first: the request may wait for them, and runs again from
  # the start once they are there.
  uploads = session.take_uploads(_shard_streams(session, req))
  # The request's uploads in order (one may be named twice).
  order = [uploads[hb.host_buffer_handle]
           for spec in req.specs for hb in spec.host_buffers]
  topology = session.services.topology
  gangs, planned, first = [], [], 0
  for n, (handle, spec) in enumerate(zip(req.array_handles, req.specs)):
    field = f"MakeArraysFromHostBufferShards: spec {n}"
    sharding, dtype, shape = _shard_spec(session, spec, field)
    islands = _islands(session, sharding, "the array")
    array = _new_array(session, handle, islands, dtype, shape, sharding)
    shard_shape = sharding.shard_shape(shape)
    shards = []
    for k, (indices, hb) in enumerate(zip(spec.addressable_shard_indices,
                                          spec.host_buffers)):
      shards.append({
          "devices": list(indices.indices),
          "dtype": dtypes.name_of(hb.dtype, strings=True),
          "shape": list(_shape(hb.shape.dims, dtype, f"{field} shard {k}")),
          "strides": _strides(hb),
      })
      _check_shard(hb, dtype, shard_shape, f"{field} shard {k}")
      _check_upload(order[first + k], shards[k]["shape"], dtype,
                    shards[k]["strides"], f"{field} shard {k}")
    # Each island gets only the shards that land on it.
    header = {"dtype": dtype, "shape": list(shape),
              "sharding": sharding.worker_spec(topology)}
    by_island = {i.id: [] for i in islands}
    by_island.update(_shards_by_island(topology, sharding, spec))
    sizes = array.island_bytes(topology)
    ops, puts = [], []
    for island, ks in by_island.items():
      blobs = [order[first + k] for k in ks]
      head, pads = payloads.frame(dict(header, shards=[shards[k] for k in ks]),
                                  [payloads.nbytes(b) for b in blobs])
      ops.append(IslandOp(island, OpKind.PUT, results=[array.buffer],
                          payload=(head, payloads.tails(pads, blobs)),
                          result_bytes=[sizes[island]]))
      puts.append((island, head, [(pad, first + k)
                                  for pad, k in zip(pads, ks)]))
    gangs.append((spec, ops))
    planned.append((array, puts))
    first += len(spec.host_buffers)
  # Every spec checked: each gang takes its array's stage (one that fails
  # leaves every stage to the session, which drops them).
  for spec, gang in gangs:  # one gang per array: ready once whole
    stage = session.staged_put([hb.host_buffer_handle
                                for hb in spec.host_buffers])
    session.services.dispatcher.submit([op._replace(stage=stage)
                                        for op in gang])
  if planned and all(a.dtype != dtypes.STRING for a, _ in planned):
    # (a request of no arrays is answered, and not planned; strings'
    # uploads vary in size)
    _plan_uploads(session, req.array_handles[0],
                  [payloads.nbytes(b) for b in order], planned, epoch)
  reply.ok(lambda r: r.array_handles.extend(req.array_handles))


def _shard_spec(session: Session, spec: Any, field: str
                ) -> tuple[Sharding, str, tuple[int, ...]]:
  """A MakeArraysFromHostBufferShards spec's sharding, dtype and shape,
  its shards checked against the sharding."""
  asp = spec.array_spec
  sharding = _sharding(session, asp.sharding)
  dtype = dtypes.name_of(asp.dtype, strings=True)
  shape = _shape(asp.shape.dims, dtype, field)
  sharding.check(len(shape), field)
  _check_shard_indices(spec, sharding, field)
  return sharding, dtype, shape


def _shards_by_island(topology: Topology, sharding: Sharding, spec: Any
                      ) -> dict[int, list[int]]:
  """The shards (their indices in the spec) each island puts, in order."""
  by_island: dict[int, list[int]] = {}
  for k, indices in enumerate(spec.addressable_shard_indices):
    for island in sorted({topology.island_of_device(sharding.devices[i]).id
                          for i in indices.indices}):
      by_island.setdefault(island, []).append(k)
  return by_island


def _shard_streams(session: Session, req: Any) -> dict[int, StreamTo | None]:
  """Each shard's upload, and where it may stream while it arrives: the
  shards of an array large enough for the overlap to pay go into one
  stage, each island's back to back as its PUT's tails (so only shards of
  whole multiples of 64 bytes, with no padding between them), and the
  client sends them at once. A host buffer in two places, or a spec with
  errors so far, does not stream (its errors come once all arrived)."""
  wanted: dict[int, StreamTo | None] = {}
  uses = collections.Counter(hb.host_buffer_handle for spec in req.specs
                             for hb in spec.host_buffers)
  for n, spec in enumerate(req.specs):
    handles = [hb.host_buffer_handle for hb in spec.host_buffers]
    dests = (None if any(uses[h] > 1 for h in handles) else
             _shard_dests(session, spec, f"spec {n}"))
    for h in handles:
      wanted[h] = None if dests is None else (
          lambda to=(dests[0], dests[1][h]): to)
  return wanted


def _shard_dests(session: Session, spec: Any, field: str
                 ) -> tuple[int, dict[int, list[StageDest]]] | None:
  """(stage, each shard's upload -> where it goes), or None."""
  try:
    # Most arrays put every step are too small to stream: their declared
    # sizes first, before the whole spec is checked.
    if sum(math.prod(hb.shape.dims) *
           dtypes.itemsize(dtypes.name_of(hb.dtype))
           for hb in spec.host_buffers) <= STREAM_MIN_BYTES:
      return None
    sharding, dtype, shape = _shard_spec(session, spec, field)
    _islands(session, sharding, "the array")
    shard_shape = sharding.shard_shape(shape)
    for hb in spec.host_buffers:
      _check_shard(hb, dtype, shard_shape, field)
    nbytes = math.prod(shard_shape) * dtypes.itemsize(dtype)
    if nbytes % payloads.ALIGN or not _streams(
        nbytes * len(spec.host_buffers), shard_shape, dtype,
        [_strides(hb) for hb in spec.host_buffers], field):
      return None
  except StatusError:
    return None
  by_island = _shards_by_island(session.services.topology, sharding, spec)
  dests: dict[int, list[StageDest]] = collections.defaultdict(list)
  for island, shards in by_island.items():
    for at, k in enumerate(shards):
      dests[spec.host_buffers[k].host_buffer_handle].append(
          StageDest(island, len(shards) * nbytes, at * nbytes))
  return session.services.dispatcher.new_stage(), dests


def _check_shard_indices(spec: Any, sharding: Sharding, field: str) -> None:
  """One host buffer per shard, each naming devices of the sharding, every
  device once."""
  if len(spec.addressable_shard_indices) != len(spec.host_buffers):
    raise invalid_argument(
        f"{field}: {len(spec.host_buffers)} host buffers for "
        f"{len(spec.addressable_shard_indices)} shards")
  seen: set[int] = set()
  for indices in spec.addressable_shard_indices:
    for i in indices.indices:
      if not 0 <= i < len(sharding.devices) or i in seen:
        raise invalid_argument(
            f"{field}: shard device index {i} is out of range or repeated "
            f"(the sharding has {len(sharding.devices)} devices)")
      seen.add(i)


def _check_shard(host_buffer: Any, dtype: str, shard_shape: Sequence[int],
                 field: str) -> None:
  """A shard's host buffer has the array's dtype and a shard's shape."""
  got = dtypes.name_of(host_buffer.dtype, strings=True)
  if got != dtype:
    raise invalid_argument(f"{field}: dtype {got} in an array of {dtype}")
  if tuple(host_buffer.shape.dims) != tuple(shard_shape):
    raise invalid_argument(
        f"{field}: shape {list(host_buffer.shape.dims)} is not a shard of "
        f"this array (its shards are {list(shard_shape)})")


@handles("make_error_arrays_request", results=lambda r: list(r.array_handles))
def make_error_arrays(session: Session, req: Any, reply: Reply) -> None:
  # A code outside absl's (or OK) would break whoever reads it back.
  code = req.error.code if req.error.code in _ERROR_CODES else Code.UNKNOWN
  status = Status(code, req.error.message)
  for h in req.array_handles:
    session.arrays.put(h, Array.failed(status))
  reply.ok(lambda r: r.array_handles.extend(req.array_handles))


@handles("copy_to_host_buffer_request")
def copy_to_host_buffer(session: Session, req: Any, reply: Reply) -> None:
  array = _usable(session, req.array_handle)
  validation.check_dense_strides(array.shape, dtypes.itemsize(array.dtype),
                                 _strides(req), "CopyToHostBuffer")
  store = session.services.host_buffers
  temporary = None
  if len(array.islands) > 1 and array.dtype == dtypes.STRING:
    raise unimplemented("a string array spanning islands is fetched shard "
                        "by shard (np.asarray does so), not whole")
  replicated = (array.sharding.maximal_device() is None and
                array.sharding.shard_shape(array.shape) == tuple(array.shape))
  if len(array.islands) > 1 and not replicated:
    # Gather onto one device (worker to worker), fetch from there; every
    # island of a replicated array holds it whole: fetched from the first.
    device = array.sharding.devices[0]
    home = session.services.topology.island_of_device(device)
    temporary = Array(session.services.dispatcher.new_buffers(1)[0], (home,),
                      array.dtype, array.shape,
                      Sharding((device,), None, array.sharding.memory_kind))
    moves.move(session.services, array, temporary)
    array = temporary

  def fetched(status: Status, results: list[Any]) -> None:
    if temporary is not None:
      moves.release(session.services, [temporary])
    if not status.ok:
      reply.error(status)
      return
    try:
      # Stored before the reply: the client looks it up only afterwards.
      store.store(session.id, req.host_buffer_handle, results[0])
    except Exception as e:  # pylint: disable=broad-except
      reply.error(from_exception(e).status)
      return
    reply.ok()

  session.services.dispatcher.submit(
      [IslandOp(array.islands[0].id, OpKind.FETCH, args=[array.buffer],
                payload=op_payloads.fetch(_strides(req)))],
      fetched)


@handles("copy_arrays_request", results=lambda r: list(r.result_handles))
def copy_arrays(session: Session, req: Any, reply: Reply) -> None:
  if len(req.result_handles) != len(req.array_handles):
    raise invalid_argument("CopyArrays needs one result handle per array")
  kind = req.memory_kind if req.HasField("memory_kind") else None
  for h, result in zip(req.array_handles, req.result_handles):
    src = _usable(session, h)
    validation.check_distinct(req.device_ids, "CopyArrays")
    sharding = src.sharding.with_devices(
        session.slice.physical(req.device_ids), kind)
    dst = _new_array(session, result, _islands(session, sharding, "the copy"),
                     src.dtype, src.shape, sharding)
    moves.move(session.services, src, dst)
  reply.ok(lambda r: r.array_handles.extend(req.result_handles))


@handles("reshard_arrays_request", results=lambda r: list(r.result_handles))
def reshard_arrays(session: Session, req: Any, reply: Reply) -> None:
  if not (len(req.result_handles) == len(req.array_handles) ==
          len(req.array_specs)):
    raise invalid_argument("ReshardArrays needs one spec and result handle "
                           "per array")
  for h, spec, result in zip(req.array_handles, req.array_specs,
                             req.result_handles):
    src = _usable(session, h)
    sharding = _sharding(session, spec.sharding)
    dtype = dtypes.name_of(spec.dtype)
    if (tuple(spec.shape.dims), dtype) != (src.shape, src.dtype):
      raise invalid_argument(
          f"ReshardArrays: spec {list(spec.shape.dims)} {dtype} for an "
          f"array of {list(src.shape)} {src.dtype}; a reshard keeps both")
    sharding.check(len(src.shape), "ReshardArrays")
    dst = _new_array(session, result,
                     _islands(session, sharding, "the resharded array"),
                     dtype, src.shape, sharding)
    moves.move(session.services, src, dst)
  reply.ok(lambda r: r.array_handles.extend(req.result_handles))


def _local_positions(sharding: Sharding, topology: Topology) -> list[int]:
  """Each shard's position among its island's shards of the array: the
  order a worker lists its local shards in (PjrtBackend.shards)."""
  seen: dict[int, int] = {}
  out = []
  for device in sharding.devices:
    island = topology.island_of_device(device).id
    out.append(seen.get(island, 0))
    seen[island] = out[-1] + 1
  return out


def _split(session: Session, src: Array, handles_: Sequence[int],
           first: int = 0) -> None:
  """Single-device arrays of len(handles_) of `src`'s shards, from
  position `first` on."""
  if len(src.sharding.devices) == 1 and len(handles_) == 1:
    # The only shard of a one-device array is the array (np.asarray asks
    # for it before every fetch): share its buffer, no worker op.
    session.arrays.put(handles_[0], src.alias(Sharding(
        src.sharding.devices, None, src.sharding.memory_kind)))
    return
  topology = session.services.topology
  buffers = session.services.dispatcher.new_buffers(len(handles_))
  shard_shape = src.sharding.shard_shape(src.shape)
  kind = src.sharding.memory_kind
  positions: dict[int, list[int]] = {}  # island -> its local positions
  results: dict[int, list[int]] = {}
  for h, b, device, local in zip(handles_, buffers,
                                 src.sharding.devices[first:],
                                 _local_positions(src.sharding,
                                                  topology)[first:]):
    island = topology.island_of_device(device)
    shard = Array(b, (island,), src.dtype, shard_shape,
                  Sharding((device,), None, kind))
    src.shares_memory_with(shard)
    session.arrays.put(h, shard)
    positions.setdefault(island.id, []).append(local)
    results.setdefault(island.id, []).append(b)
  # The shards share the source's device memory: no result_bytes.
  session.services.dispatcher.submit(
      [IslandOp(i, OpKind.COPY, args=[src.buffer], results=results[i],
                payload=op_payloads.shards(positions[i]))
       for i in positions])


@handles("disassemble_into_single_device_arrays_request",
         results=lambda r: list(r.result_handles))
def disassemble(session: Session, req: Any, reply: Reply) -> None:
  src = _usable(session, req.array_handle)
  if len(req.result_handles) != src.sharding.num_shards:
    raise invalid_argument(
        f"{len(req.result_handles)} result handles for an array of "
        f"{src.sharding.num_shards} shards")
  _split(session, src, req.result_handles)
  reply.ok(lambda r: r.array_handles.extend(req.result_handles))


@handles("fully_replicated_shard_request", results=lambda r: [r.result_handle])
def fully_replicated_shard(session: Session, req: Any, reply: Reply) -> None:
  src = _usable(session, req.array_handle)
  # A maximal array (a host callback's result) is whole on one device,
  # which JAX counts as replicated.
  position = src.sharding.maximal_device()
  if src.sharding.op_sharding is not None and position is None:
    raise invalid_argument("FullyReplicatedShard of an array that is not "
                           "fully replicated")
  _split(session, src, [req.result_handle], position or 0)
  reply.ok(lambda r: setattr(r, "array_handle", req.result_handle))


@handles("assemble_array_from_single_device_arrays_request",
         results=lambda r: [r.result_handle])
def assemble(session: Session, req: Any, reply: Reply) -> None:
  parts = [_usable(session, h) for h in req.single_device_array_handles]
  if not parts:
    raise invalid_argument("assembling an array from no shards")
  sharding = _sharding(session, req.sharding)
  islands = _islands(session, sharding, "the assembled array")
  dtype = dtypes.name_of(req.dtype) if req.HasField("dtype") else parts[0].dtype
  shape = _shape(req.shape.dims, dtype, "AssembleArrayFromSingleDeviceArrays")
  sharding.check(len(shape), "AssembleArrayFromSingleDeviceArrays")
  if any(p.dtype != dtype for p in parts):
    raise invalid_argument(
        f"AssembleArrayFromSingleDeviceArrays: shards of dtypes "
        f"{sorted({p.dtype for p in parts})} for an array of {dtype}")
  only = parts[0]
  if (len(parts) == 1 and only.sharding is not None and
      only.sharding.devices == sharding.devices and only.shape == shape and
      only.dtype == dtype and sharding.op_sharding is None):
    # An array of one shard is that shard (jax.device_put to another device
    # ends this way): share its buffer.
    session.arrays.put(req.result_handle, only.alias(sharding))
    reply.ok(lambda r: setattr(r, "array_handle", req.result_handle))
    return
  array = _new_array(session, req.result_handle, islands, dtype, shape,
                     sharding)
  spec = sharding.worker_spec(session.services.topology)
  by_island: dict[int, list[int]] = {}
  for p in parts:
    if len(p.islands) != 1 or p.islands[0] not in islands:
      raise invalid_argument(
          "a shard lives outside the assembled array's islands")
    by_island.setdefault(p.islands[0].id, []).append(p.buffer)
    array.shares_memory_with(p)
  # The assembled array shares its shards' device memory: no result_bytes.
  session.services.dispatcher.submit(
      [IslandOp(i.id, OpKind.COPY, args=by_island.get(i.id, []),
                results=[array.buffer],
                payload=payloads.encode({
                    "mode": "assemble", "shape": list(shape),
                    "sharding": spec}))
       for i in islands])
  reply.ok(lambda r: setattr(r, "array_handle", req.result_handle))


@handles("remap_arrays_request", results=lambda r: list(r.result_handles))
def remap_arrays(session: Session, req: Any, reply: Reply) -> None:
  inputs = [_usable(session, h) for h in req.array_handles]
  outputs = remap_plan.parse(req, inputs, session.slice)
  islands = [_islands(session, o.sharding, "the remapped array")
             for o in outputs]
  topology = session.services.topology
  local = [_local_positions(a.sharding, topology) for a in inputs]
  # Per island: the inputs it reads, the outputs it makes, and of each
  # output the (input, local position) of its shards there.
  ops: dict[int, tuple[list[int], list[int], list[dict[str, Any]]]] = {}
  for handle, out, where in zip(req.result_handles, outputs, islands):
    array = _new_array(session, handle, where, out.dtype, out.shape,
                       out.sharding)
    spec = out.sharding.worker_spec(topology)
    for island in where:
      args, results, made = ops.setdefault(island.id, ([], [], []))
      pieces = []
      for device, (a, p) in zip(out.sharding.devices, out.pieces):
        if topology.island_of_device(device).id != island.id:
          continue
        if inputs[a].buffer not in args:
          args.append(inputs[a].buffer)
        pieces.append([args.index(inputs[a].buffer), local[a][p]])
      results.append(array.buffer)
      made.append({"shape": list(out.shape), "sharding": spec,
                   "pieces": pieces})
    for a in {a for a, _ in out.pieces}:
      array.shares_memory_with(inputs[a])
  # The outputs are the inputs' device memory: no result_bytes.
  session.services.dispatcher.submit(
      [IslandOp(i, OpKind.COPY, args=args, results=results,
                payload=payloads.encode({"mode": "remap", "outputs": made}))
       for i, (args, results, made) in ops.items()])
  if req.copy_semantics == remap_plan.DONATE_INPUT:
    # The inputs' handles die; their shards live on in the outputs.
    for src in inputs:
      src.deleted = True
    moves.release(session.services, inputs)
  reply.ok(lambda r: r.array_handles.extend(req.result_handles))


@handles("bitcast_arrays_request", results=lambda r: list(r.result_handles))
def bitcast_arrays(session: Session, req: Any, reply: Reply) -> None:
  raise unimplemented("BitcastArrays is not supported by jax_pathways yet")


@handles("delete_array_request")
def delete_array(session: Session, req: Any, reply: Reply) -> None:
  arrays = [session.arrays.get(h) for h in req.array_handle]
  for array in arrays:
    array.deleted = True
  # A DELETE is done once it has its place in each island's order.
  moves.release(session.services, arrays)
  handle = new_done_future(session)
  reply.ok(lambda r: setattr(r, "deletion_future_handle", handle))


# Unknown handles an error names at most.
_SHOWN = 8


@handles("destruct_array_request")
def destruct_array(session: Session, req: Any, reply: Reply) -> None:
  arrays, unknown = [], []
  for h in req.array_handle:
    array = session.arrays.discard(h)
    if array is None:
      unknown.append(h)
    elif array.islands:
      arrays.append(array)
  # Free the memory now; ops already queued that use these run first.
  moves.release(session.services, arrays)
  if unknown:
    # A request may name millions: the reply says how many, and a few.
    shown = ", ".join(map(str, unknown[:_SHOWN]))
    more = f", ... ({len(unknown)} in all)" if len(unknown) > _SHOWN else ""
    raise StatusError(Code.NOT_FOUND,
                      f"unknown array handle(s): [{shown}{more}]")
  reply.ok()


@handles("is_array_deleted_request")
def is_array_deleted(session: Session, req: Any, reply: Reply) -> None:
  array = session.arrays.get(req.array_handle)
  deleted = array.deleted or array.shared.donated
  reply.ok(lambda r: setattr(r, "deleted", deleted))
