"""Array requests: uploads, downloads, copies, reshards and deletion.

Each request becomes ops on the island that holds the array; a copy to
another island becomes a SEND on the source and a RECEIVE on the destination,
submitted as one gang so the bytes go worker to worker. Requests that create
arrays register them under the client's handles before returning, even though
the ops run later.
"""
from __future__ import annotations

import secrets
from typing import Any, Sequence

from jax_pathways import dtypes
from jax_pathways.controller.arrays import Array
from jax_pathways.controller.handlers.registry import handles
from jax_pathways.controller.session import Reply, Session
from jax_pathways.dispatch import payloads
from jax_pathways.dispatch.dispatcher import IslandOp, OpKind
from jax_pathways.programs import sharding as sharding_lib
from jax_pathways.programs.sharding import Sharding
from jax_pathways.status import Code, Status, StatusError, from_exception, invalid_argument, unimplemented

_PJRT_LAYOUT = "xla::ifrt::PjRtLayout"


def _usable(session: Session, handle: int) -> Array:
  array = session.arrays.get(handle)
  array.check_usable()
  return array


def _check_layout(req: Any, rank: int) -> None:
  """Only the default (row-major) layout is supported."""
  if not req.HasField("layout"):
    return
  from jax_pathways import protos  # pylint: disable=import-outside-toplevel
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


def _put(session: Session, handle: int, dtype: str, shape: Sequence[int],
         sharding: Sharding, header: dict[str, Any], blobs: list[bytes]) -> None:
  island = session.services.topology.place(sharding.devices, "the array")
  buffer = session.services.dispatcher.new_buffers(1)[0]
  session.arrays.put(handle, Array(buffer, island, dtype, tuple(shape),
                                   sharding))
  header.update(dtype=dtype, shape=list(shape),
                sharding=sharding.worker_spec(island))
  session.services.dispatcher.submit(
      [IslandOp(island.id, OpKind.PUT, results=[buffer],
                payload=payloads.encode(header, *blobs))])


def _upload(session: Session, handle: int) -> Any:
  """The client's upload (a uint8 array), waiting for it if need be."""
  try:
    return session.services.host_buffers.take(
        session.id, handle, session.services.upload_timeout_s)
  except Exception as e:  # pylint: disable=broad-except
    raise from_exception(e) from None


@handles("make_array_from_host_buffer_request",
         results=lambda r: [r.array_handle] if r.HasField("array_handle") else [])
def make_array_from_host_buffer(session: Session, req: Any,
                                reply: Reply) -> None:
  if not req.HasField("array_handle"):
    raise invalid_argument("MakeArrayFromHostBuffer without an array_handle "
                           "(protocol versions below 10 are not supported)")
  data = _upload(session, req.host_buffer_handle)
  dtype = dtypes.name_of(req.dtype)
  _check_layout(req, len(req.shape.dims))
  _put(session, req.array_handle, dtype, req.shape.dims,
       sharding_lib.from_proto(req.sharding), {"strides": _strides(req)},
       [data])
  reply.ok(lambda r: setattr(r, "array_handle", req.array_handle))


@handles("make_arrays_from_host_buffer_shards_request",
         results=lambda r: list(r.array_handles))
def make_arrays_from_host_buffer_shards(session: Session, req: Any,
                                        reply: Reply) -> None:
  if len(req.array_handles) != len(req.specs):
    raise invalid_argument(f"{len(req.specs)} specs for "
                           f"{len(req.array_handles)} array handles")
  for handle, spec in zip(req.array_handles, req.specs):
    asp = spec.array_spec
    sharding = sharding_lib.from_proto(asp.sharding)
    shards, blobs = [], []
    for indices, hb in zip(spec.addressable_shard_indices, spec.host_buffers):
      shards.append({
          "devices": list(indices.indices),
          "dtype": dtypes.name_of(hb.dtype),
          "shape": list(hb.shape.dims),
          "strides": (list(hb.byte_strides.strides)
                      if hb.HasField("byte_strides") else None),
      })
      blobs.append(_upload(session, hb.host_buffer_handle))
    _put(session, handle, dtypes.name_of(asp.dtype), asp.shape.dims, sharding,
         {"shards": shards}, blobs)
  reply.ok(lambda r: r.array_handles.extend(req.array_handles))


@handles("make_error_arrays_request", results=lambda r: list(r.array_handles))
def make_error_arrays(session: Session, req: Any, reply: Reply) -> None:
  status = Status(req.error.code or Code.UNKNOWN, req.error.message)
  for h in req.array_handles:
    session.arrays.put(h, Array.failed(status))
  reply.ok(lambda r: r.array_handles.extend(req.array_handles))


@handles("copy_to_host_buffer_request")
def copy_to_host_buffer(session: Session, req: Any, reply: Reply) -> None:
  array = _usable(session, req.array_handle)
  store = session.services.host_buffers

  def fetched(status: Status, results: list[bytes]) -> None:
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
      [IslandOp(array.island.id, OpKind.FETCH, args=[array.buffer],
                payload=payloads.encode({"strides": _strides(req)}))],
      fetched)


def _copy_within(session: Session, src: Array, handle: int, dtype: str,
                 shape: Sequence[int], sharding: Sharding) -> None:
  buffer = session.services.dispatcher.new_buffers(1)[0]
  island = src.island
  session.arrays.put(handle, Array(buffer, island, dtype, tuple(shape),
                                   sharding))
  session.services.dispatcher.submit(
      [IslandOp(island.id, OpKind.COPY, args=[src.buffer], results=[buffer],
                payload=payloads.encode({
                    "mode": "reshard",
                    "sharding": sharding.worker_spec(island)}))])


def _move(session: Session, src: Array, handle: int, dtype: str,
          shape: Sequence[int], sharding: Sharding) -> None:
  """Copies `src` onto `sharding`'s devices, worker to worker if needed."""
  topology = session.services.topology
  dst_island = topology.place(sharding.devices, "the destination")
  if dst_island is src.island:
    _copy_within(session, src, handle, dtype, shape, sharding)
    return
  if dtype != src.dtype or tuple(shape) != src.shape:
    raise invalid_argument(
        f"cannot change dtype or shape ({src.dtype}{list(src.shape)} -> "
        f"{dtype}{list(shape)}) while moving between islands")
  buffer = session.services.dispatcher.new_buffers(1)[0]
  # Pieces travel as transfer, transfer + 1, ...: random, so nobody else's
  # transfer ids can collide with (or guess) these.
  transfer = secrets.randbits(48) << 12
  session.arrays.put(handle, Array(buffer, dst_island, dtype, tuple(shape),
                                   sharding))
  source = src.sharding.worker_spec(src.island)
  send = payloads.encode({
      "island": dst_island.id, "address": dst_island.data_address,
      "arrays": [{"transfer": transfer, "shape": list(shape),
                  "sharding": source}]})
  receive = payloads.encode({
      "island": src.island.id,
      "arrays": [{"transfer": transfer, "dtype": dtype, "shape": list(shape),
                  "source": source,
                  "sharding": sharding.worker_spec(dst_island)}]})
  session.services.dispatcher.submit([
      IslandOp(src.island.id, OpKind.SEND, args=[src.buffer], payload=send),
      IslandOp(dst_island.id, OpKind.RECEIVE, results=[buffer],
               payload=receive),
  ])


@handles("copy_arrays_request", results=lambda r: list(r.result_handles))
def copy_arrays(session: Session, req: Any, reply: Reply) -> None:
  if len(req.result_handles) != len(req.array_handles):
    raise invalid_argument("CopyArrays needs one result handle per array")
  kind = req.memory_kind if req.HasField("memory_kind") else None
  for h, result in zip(req.array_handles, req.result_handles):
    src = _usable(session, h)
    _move(session, src, result, src.dtype, src.shape,
          src.sharding.with_devices(req.device_ids, kind))
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
    _move(session, src, result, dtypes.name_of(spec.dtype), spec.shape.dims,
          sharding_lib.from_proto(spec.sharding))
  reply.ok(lambda r: r.array_handles.extend(req.result_handles))


def _split(session: Session, src: Array, handles_: Sequence[int]) -> None:
  """Single-device arrays of `src`'s first len(handles_) shards."""
  buffers = session.services.dispatcher.new_buffers(len(handles_))
  shard_shape = src.sharding.shard_shape(src.shape)
  kind = src.sharding.memory_kind
  for h, b, device in zip(handles_, buffers, src.sharding.devices):
    session.arrays.put(h, Array(b, src.island, src.dtype, shard_shape,
                                Sharding((device,), None, kind)))
  session.services.dispatcher.submit(
      [IslandOp(src.island.id, OpKind.COPY, args=[src.buffer],
                results=buffers, payload=payloads.encode({"mode": "shards"}))])


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
  if src.sharding.op_sharding is not None:
    raise invalid_argument("FullyReplicatedShard of an array that is not "
                           "fully replicated")
  _split(session, src, [req.result_handle])
  reply.ok(lambda r: setattr(r, "array_handle", req.result_handle))


@handles("assemble_array_from_single_device_arrays_request",
         results=lambda r: [r.result_handle])
def assemble(session: Session, req: Any, reply: Reply) -> None:
  parts = [_usable(session, h) for h in req.single_device_array_handles]
  if not parts:
    raise invalid_argument("assembling an array from no shards")
  sharding = sharding_lib.from_proto(req.sharding)
  islands = sorted({p.island.id for p in parts})
  if len(islands) > 1:
    raise unimplemented(
        f"an array assembled from shards on islands {islands} would span "
        "islands; arrays must stay within one island for now")
  island = parts[0].island
  dtype = dtypes.name_of(req.dtype) if req.HasField("dtype") else parts[0].dtype
  buffer = session.services.dispatcher.new_buffers(1)[0]
  session.arrays.put(req.result_handle, Array(
      buffer, island, dtype, tuple(req.shape.dims), sharding))
  session.services.dispatcher.submit(
      [IslandOp(island.id, OpKind.COPY, args=[p.buffer for p in parts],
                results=[buffer],
                payload=payloads.encode({
                    "mode": "assemble", "shape": list(req.shape.dims),
                    "sharding": sharding.worker_spec(island)}))])
  reply.ok(lambda r: setattr(r, "array_handle", req.result_handle))


@handles("remap_arrays_request", results=lambda r: list(r.result_handles))
def remap_arrays(session: Session, req: Any, reply: Reply) -> None:
  raise unimplemented("RemapArrays is not supported by jax_pathways yet")


@handles("bitcast_arrays_request", results=lambda r: list(r.result_handles))
def bitcast_arrays(session: Session, req: Any, reply: Reply) -> None:
  raise unimplemented("BitcastArrays is not supported by jax_pathways yet")


@handles("delete_array_request")
def delete_array(session: Session, req: Any, reply: Reply) -> None:
  import concurrent.futures  # pylint: disable=import-outside-toplevel
  by_island: dict[int, list[int]] = {}
  for h in req.array_handle:
    array = session.arrays.get(h)
    if array.island is not None and not array.released:
      by_island.setdefault(array.island.id, []).append(array.buffer)
      array.released = True
    array.deleted = True
  future: concurrent.futures.Future = concurrent.futures.Future()
  remaining = [len(by_island)]

  def deleted(status: Status, _: list[bytes]) -> None:
    remaining[0] -= 1
    if not future.done() and (not status.ok or remaining[0] == 0):
      future.set_result(status)

  if not by_island:
    future.set_result(Status())
  for island, buffers in by_island.items():
    session.services.dispatcher.submit(
        [IslandOp(island, OpKind.DELETE, args=buffers)], deleted)
  handle = session.server_handles.new()
  session.futures.put(handle, future)
  reply.ok(lambda r: setattr(r, "deletion_future_handle", handle))


@handles("destruct_array_request")
def destruct_array(session: Session, req: Any, reply: Reply) -> None:
  by_island: dict[int, list[int]] = {}
  unknown = []
  for h in req.array_handle:
    array = session.arrays.discard(h)
    if array is None:
      unknown.append(h)
    elif array.island is not None:
      if not array.released:
        by_island.setdefault(array.island.id, []).append(array.buffer)
        array.released = True
      session.services.dispatcher.forget([array.buffer])
  # Free the memory now; ops already queued that use these run first.
  for island, buffers in by_island.items():
    session.services.dispatcher.submit(
        [IslandOp(island, OpKind.DELETE, args=buffers)])
  if unknown:
    raise StatusError(Code.NOT_FOUND, f"unknown array handle(s): {unknown}")
  reply.ok()


@handles("is_array_deleted_request")
def is_array_deleted(session: Session, req: Any, reply: Reply) -> None:
  deleted = session.arrays.get(req.array_handle).deleted
  reply.ok(lambda r: setattr(r, "deleted", deleted))
