"""Callback messages: what worker, controller and client say about callbacks.

A program's callbacks run in the process of the client that compiled it
(controller/callback_router.py routes them). Every message is a payload
(wire/payloads.py: a JSON header, then raw blobs) with "kind" and "id":

    worker -> controller   call   {route, index, args}       blobs: args
                           ask    {route, what, question}    blobs: see ask()
    controller -> client   call   {table, index, args}       blobs: args
                           ask    {what, question}           blobs
                           forget {table}                    (no reply)
    client -> controller,  reply  {results} | {error}        blobs: results
    controller -> worker

Arrays travel as specs ({"dtype", "shape"}, or {"token": true} for the
tokens ordered effects thread through a callback) beside their bytes in
the blobs. Between worker and controller payloads are framed on a socket
(write_frame/read_frame); between client and controller each is one
message of a gRPC stream.
"""
from __future__ import annotations

import socket
import struct
from typing import Any, Sequence

import numpy as np

from jax_pathways import validation
from jax_pathways.status import Code, Status, invalid_argument
from jax_pathways.wire import payloads

CALL = "call"
ASK = "ask"
FORGET = "forget"
REPLY = "reply"
# Compile-time questions (ask's "what").
INSPECT = "inspect"
PARTITION = "partition"
INFER = "infer"
PROPAGATE = "propagate"
ASKS = frozenset({INSPECT, PARTITION, INFER, PROPAGATE})

# The dtypes an array of a callback may have: plain numeric ones (an object
# array built from bytes off the wire would hold pointers).
DTYPES = frozenset({
    "bool", "int2", "int4", "int8", "int16", "int32", "int64", "uint2",
    "uint4", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
    "float64", "bfloat16", "complex64", "complex128", "float8_e3m4",
    "float8_e4m3", "float8_e4m3fn", "float8_e4m3b11fnuz", "float8_e4m3fnuz",
    "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn",
})
_FRAME = struct.Struct("<Q")
# The largest frame a socket end reads: a callback's arrays, whole.
MAX_FRAME_BYTES = 1 << 36
# A callback's operands (or results), all together: what one message to
# the client (or from it) may carry, the controller's request bound. One
# of 1 GiB took the controller 4 GiB on its way through (issue 53 row 6).
MAX_VALUES_BYTES = 256 << 20


def encode(header: dict[str, Any], blobs: Sequence[Any] = ()) -> bytes:
  return payloads.encode(header, *blobs)


def decode(data: Any) -> tuple[dict[str, Any], list[memoryview]]:
  """A message's header and blobs; raises ValueError if it is not one."""
  header, blobs = payloads.decode(data)
  if not isinstance(header, dict) or not isinstance(header.get("kind"), str):
    raise ValueError("callback message without a kind")
  if type(header.get("id", 0)) is not int:  # pylint: disable=unidiomatic-typecheck
    raise ValueError("callback message id is not an integer")
  return header, blobs


def error_reply(call_id: int, status: Status) -> bytes:
  return encode({"kind": REPLY, "id": call_id,
                 "error": {"code": int(status.code),
                           "message": status.message}})


def reply_status(header: dict[str, Any]) -> Status:
  """A reply's failure as a Status (OK if it carries results)."""
  error = header.get("error")
  if error is None:
    return Status()
  if not isinstance(error, dict):
    return Status(Code.INTERNAL, "malformed callback error")
  code = error.get("code")
  if type(code) is not int or not 0 < code <= max(Code):  # pylint: disable=unidiomatic-typecheck
    code = int(Code.INTERNAL)
  return Status(code, str(error.get("message", ""))[:1 << 16])


def pack_arrays(values: Sequence[Any], what: str
                ) -> tuple[list[dict[str, Any]], list[Any]]:
  """(specs, blobs) of a callback's `what` (operands, results); None is a
  token. INVALID_ARGUMENT past MAX_VALUES_BYTES."""
  specs, blobs, total = [], [], 0
  for value in values:
    if value is None:
      specs.append({"token": True})
      continue
    array = np.asarray(value, order="C")  # 0-d stays 0-d
    if array.dtype.name not in DTYPES:
      raise TypeError(f"a callback value of dtype {array.dtype} cannot "
                      "cross processes")
    total += array.nbytes
    if total > MAX_VALUES_BYTES:
      raise invalid_argument(
          f"a host callback's {what} are more than {MAX_VALUES_BYTES >> 20} "
          f"MiB, the most one callback carries between the islands and the "
          f"client's process: pass it less (a summary, a slice), or keep the "
          f"work on the devices")
    specs.append({"dtype": array.dtype.name, "shape": list(array.shape)})
    blobs.append(memoryview(array.reshape(-1).view(np.uint8)))
  return specs, blobs


def unpack_arrays(specs: Any, blobs: Sequence[memoryview],
                  what: str) -> list[np.ndarray | None]:
  """The values pack_arrays packed, checked: dtype, shape and byte count of
  each, one blob per array. Arrays are writable copies (a callback may
  change its operands; nothing may alias a received message)."""
  if not isinstance(specs, list):
    raise invalid_argument(f"{what}: values are not a list")
  out: list[np.ndarray | None] = []
  blob = 0
  for spec in specs:
    if not isinstance(spec, dict):
      raise invalid_argument(f"{what}: a value spec is not an object")
    if spec.get("token"):
      out.append(None)
      continue
    dtype = spec.get("dtype")
    if dtype not in DTYPES:
      raise invalid_argument(f"{what}: dtype {dtype!r} is not a numeric "
                             "dtype")
    np_type = np.dtype(jnp_dtype(dtype))
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(
        type(d) is int for d in shape):  # pylint: disable=unidiomatic-typecheck
      raise invalid_argument(f"{what}: shape {shape!r} is not a shape")
    shape = validation.check_shape(shape, np_type.itemsize, what)
    if blob >= len(blobs):
      raise invalid_argument(f"{what}: fewer blobs than arrays")
    data = blobs[blob]
    blob += 1
    size = int(np.prod(shape, dtype=np.int64)) * np_type.itemsize
    if memoryview(data).nbytes != size:
      raise invalid_argument(
          f"{what}: {memoryview(data).nbytes} bytes for a {dtype}"
          f"{list(shape)} array of {size}")
    out.append(np.frombuffer(data, np_type).reshape(shape).copy())
  if blob != len(blobs):
    raise invalid_argument(f"{what}: more blobs than arrays")
  return out


def jnp_dtype(name: str) -> Any:
  """The numpy dtype of a dtype name, ml_dtypes' too (bfloat16, float8_*)."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  return jnp.dtype(name)


def write_frame(sock: socket.socket, payload: bytes) -> None:
  sock.sendall(_FRAME.pack(len(payload)) + payload)


def read_frame(sock: socket.socket) -> bytearray | None:
  """The next frame, or None once the other end closed the connection."""
  head = _read_exactly(sock, _FRAME.size)
  if head is None:
    return None
  (size,) = _FRAME.unpack(head)
  if size > MAX_FRAME_BYTES:
    raise ValueError(f"callback frame of {size} bytes")
  data = _read_exactly(sock, size)
  if data is None:
    raise ValueError("connection closed inside a callback frame")
  return data


def _read_exactly(sock: socket.socket, n: int) -> bytearray | None:
  buf = bytearray(n)
  view = memoryview(buf)
  got = 0
  while got < n:
    k = sock.recv_into(view[got:])
    if k == 0:
      if got == 0:
        return None
      raise ValueError("connection closed inside a callback frame")
    got += k
  return buf


# ---------------------------------------------------------------- compile time
# XLA's partitioner asks in xla_client Shapes and HloShardings; they travel
# as JSON specs and serialized OpSharding protos.
_MAX_TUPLE_DEPTH = 8


def shape_spec(shape: Any) -> Any:
  """An xla_client.Shape as JSON."""
  if shape.is_tuple():
    return {"tuple": [shape_spec(s) for s in shape.tuple_shapes()]}
  return {"dtype": shape.numpy_dtype().name, "dims": list(shape.dimensions())}


def shape_of(spec: Any, what: str, depth: int = 0) -> Any:
  """shape_spec's inverse, checked."""
  from jax._src.lib import xla_client as xc  # pylint: disable=import-outside-toplevel
  if not isinstance(spec, dict) or depth > _MAX_TUPLE_DEPTH:
    raise invalid_argument(f"{what}: malformed shape")
  if "tuple" in spec:
    parts = spec["tuple"]
    if not isinstance(parts, list):
      raise invalid_argument(f"{what}: malformed tuple shape")
    return xc.Shape.tuple_shape([shape_of(p, what, depth + 1) for p in parts])
  dtype, dims = spec.get("dtype"), spec.get("dims")
  if dtype not in DTYPES or not isinstance(dims, list) or not all(
      type(d) is int for d in dims):  # pylint: disable=unidiomatic-typecheck
    raise invalid_argument(f"{what}: malformed array shape")
  np_type = np.dtype(jnp_dtype(dtype))
  return xc.Shape.array_shape(np_type,
                              validation.check_shape(dims, np_type.itemsize,
                                                     what))


def pack_shardings(shardings: Sequence[Any], blobs: list[Any]) -> list[Any]:
  """HloShardings (or None) as blob indices (or None), appending to blobs.
  (A replicated sharding serializes to no bytes at all.)"""
  out = []
  for s in shardings:
    if s is None:
      out.append(None)
      continue
    out.append(len(blobs))
    blobs.append(s.to_proto().SerializeToString())
  return out


def unpack_shardings(refs: Any, blobs: Sequence[memoryview],
                     what: str) -> list[Any]:
  from jax._src.lib import xla_client as xc  # pylint: disable=import-outside-toplevel
  if not isinstance(refs, list):
    raise invalid_argument(f"{what}: shardings are not a list")
  out = []
  for ref in refs:
    if ref is None:
      out.append(None)
      continue
    if type(ref) is not int or not 0 <= ref < len(blobs):  # pylint: disable=unidiomatic-typecheck
      raise invalid_argument(f"{what}: sharding blob {ref!r} out of range")
    proto = xc.OpSharding()
    try:
      proto.ParseFromString(bytes(blobs[ref]))
      out.append(xc.HloSharding.from_proto(proto))
    except Exception as e:  # pylint: disable=broad-except
      raise invalid_argument(f"{what}: unreadable sharding ({e})") from None
  return out
