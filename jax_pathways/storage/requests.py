"""Persistence requests: pathwaysutils' JSON plans for bytes at rest, read as hostile input.

pathwaysutils 0.1.13 (persistence/helper.py) and orbax's
CloudPathwaysArrayHandler (cloud_pathways_helper.py) compile a PluginProgram
whose JSON is one of

    {"persistenceWriteRequest": W}
    {"bulk_persistence_write_request": {"write_requests": [W, ...]}}
    {"persistenceReadRequest": R}
    {"bulk_persistence_read_request": {"read_requests": [R, ...]}}

    W = {"b64_location", "b64_name", "b64_hlo_sharding_string",
         "shape": [dims], "devices": {"device_ids": [ids]},
         "timeout": {"seconds", "nanos"}}
    R = the same, but "shape": {"xla_primitive_type_str": "F32",
                                "dimensions": [dims]}

A write executable takes the arrays as arguments and returns nothing; a
read's outputs are the arrays, of the shapes, dtypes and shardings given.
Each array is stored at `<location>/<name>`. The field names are theirs:
their code is the spec. This module reads them (parse, on the controller)
and writes them (bulk, for jax_pathways' own client: elastic commits);
it only checks a request's shape; the workers confine its paths to their
storage root (storage/paths.py).
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
from typing import Any

from google.protobuf.message import DecodeError

from jax_pathways.programs.sharding import Sharding, from_op_sharding
from jax_pathways.status import brief, invalid_argument
from jax_pathways.storage import paths

WRITE, BULK_WRITE = "persistenceWriteRequest", "bulk_persistence_write_request"
READ, BULK_READ = "persistenceReadRequest", "bulk_persistence_read_request"
KINDS = (WRITE, BULK_WRITE, READ, BULK_READ)
# Arrays one request may name (a model's parameters and optimizer state).
MAX_ARRAYS = 100_000
MAX_RANK = 64
# What one array may hold, in elements: beyond any device's memory.
MAX_ELEMENTS = 1 << 50
# pathwaysutils' names (XLA's PrimitiveType) -> numpy's.
_PRIMITIVE_TYPES = {
    "PRED": "bool", "S8": "int8", "S16": "int16", "S32": "int32",
    "S64": "int64", "U8": "uint8", "U16": "uint16", "U32": "uint32",
    "U64": "uint64", "F16": "float16", "BF16": "bfloat16", "F32": "float32",
    "F64": "float64", "C64": "complex64", "C128": "complex128",
}
_PRIMITIVE_NAMES = {v: k for k, v in _PRIMITIVE_TYPES.items()}
_ARRAY_KEYS = {"b64_location", "b64_name", "b64_hlo_sharding_string", "shape",
               "devices", "timeout"}


@dataclasses.dataclass(frozen=True)
class StoredArray:
  """One array of a request: where it lives and how it is laid out."""
  location: str              # a directory (or URL) of the checkpoint
  name: str                  # the array's, relative to it
  shape: tuple[int, ...]
  dtype: str | None          # numpy's name; None in writes (the argument's)
  sharding: Sharding         # over the client's (virtual) device ids
  timeout_s: float

  @property
  def path(self) -> str:
    return f"{self.location}/{self.name}"


@dataclasses.dataclass(frozen=True)
class PersistenceRequest:
  write: bool
  arrays: tuple[StoredArray, ...]


def parse(kind: str, body: Any) -> PersistenceRequest:
  """The request of `kind` (one of KINDS) whose JSON value is `body`."""
  write = kind in (WRITE, BULK_WRITE)
  if kind in (WRITE, READ):
    items = [body]
  else:
    field = "write_requests" if write else "read_requests"
    if not isinstance(body, dict) or set(body) != {field}:
      raise invalid_argument(f"{kind} must be an object with one field, "
                             f"{field!r}")
    items = body[field]
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_ARRAYS:
      raise invalid_argument(f"{kind}.{field} must list 1 to {MAX_ARRAYS} "
                             "requests")
  arrays = tuple(_array(item, write, f"{kind} array {i}")
                 for i, item in enumerate(items))
  seen: set[str] = set()
  for a in arrays:
    if a.path in seen:
      raise invalid_argument(f"{kind} names {a.path!r} twice")
    seen.add(a.path)
  return PersistenceRequest(write, arrays)


def bulk(write: bool, location: str, arrays: list[dict[str, Any]],
         timeout_s: float) -> str:
  """A bulk request's JSON: `arrays` = [{"name", "shape", "dtype" (reads),
  "op_sharding" (serialized xla.OpSharding), "device_ids"}]."""
  whole, nanos = divmod(timeout_s, 1)
  entries = []
  for a in arrays:
    entry: dict[str, Any] = {
        "b64_location": _b64(location), "b64_name": _b64(a["name"]),
        "b64_hlo_sharding_string": base64.b64encode(
            a["op_sharding"]).decode(),
        "shape": list(a["shape"]),
        "devices": {"device_ids": list(a["device_ids"])},
        "timeout": {"seconds": int(whole), "nanos": int(nanos * 1e9)}}
    if not write:
      entry["shape"] = {"xla_primitive_type_str": _PRIMITIVE_NAMES[a["dtype"]],
                        "dimensions": list(a["shape"])}
    entries.append(entry)
  if write:
    return json.dumps({BULK_WRITE: {"write_requests": entries}})
  return json.dumps({BULK_READ: {"read_requests": entries}})


def _b64(text: str) -> str:
  return base64.b64encode(text.encode()).decode()


def _array(item: Any, write: bool, what: str) -> StoredArray:
  if not isinstance(item, dict) or set(item) != _ARRAY_KEYS:
    raise invalid_argument(
        f"{what} must be an object with the fields {sorted(_ARRAY_KEYS)}, "
        f"got {brief(sorted(item) if isinstance(item, dict) else item)}")
  location = _text(item["b64_location"], f"{what}: b64_location")
  name = _text(item["b64_name"], f"{what}: b64_name")
  paths.join(location, name, what)
  if write:
    dims, dtype = item["shape"], None
  else:
    shape = item["shape"]
    if not isinstance(shape, dict) or set(shape) != {"xla_primitive_type_str",
                                                     "dimensions"}:
      raise invalid_argument(f"{what}: shape must be an object with "
                             "xla_primitive_type_str and dimensions")
    dims = shape["dimensions"]
    dtype = _PRIMITIVE_TYPES.get(shape["xla_primitive_type_str"])
    if dtype is None:
      raise invalid_argument(
          f"{what}: xla_primitive_type_str "
          f"{brief(shape['xla_primitive_type_str'])} is not one of "
          f"{sorted(_PRIMITIVE_TYPES)}")
  if (not isinstance(dims, list) or len(dims) > MAX_RANK or
      not all(type(d) is int and d >= 0 for d in dims) or  # pylint: disable=unidiomatic-typecheck
      math.prod(dims) > MAX_ELEMENTS):
    raise invalid_argument(f"{what}: shape {brief(dims)} is not a list of "
                           f"at most {MAX_RANK} sizes (>= 0) of at most "
                           f"{MAX_ELEMENTS} elements in all")
  devices = item["devices"]
  ids = devices.get("device_ids") if isinstance(devices, dict) else None
  if (not isinstance(ids, list) or not ids or set(devices) != {"device_ids"}
      or not all(type(d) is int and d >= 0 for d in ids)):  # pylint: disable=unidiomatic-typecheck
    raise invalid_argument(f"{what}: devices must be {{'device_ids': "
                           f"[ids]}}, got {brief(devices)}")
  try:
    sharding = from_op_sharding(
        ids, item["b64_hlo_sharding_string"], None)
  except (TypeError, ValueError, binascii.Error, DecodeError) as e:
    raise invalid_argument(f"{what}: b64_hlo_sharding_string is not a "
                           f"base64 xla.OpSharding: {e}") from None
  sharding.check(len(dims), what)
  return StoredArray(location.rstrip("/"), name, tuple(dims), dtype, sharding,
                     _timeout(item["timeout"], what))


def _text(value: Any, what: str) -> str:
  if not isinstance(value, str):
    raise invalid_argument(f"{what} must be a base64 string")
  try:
    return base64.b64decode(value, validate=True).decode("utf-8")
  except (binascii.Error, UnicodeDecodeError) as e:
    raise invalid_argument(f"{what} is not base64 of UTF-8 text: {e}") \
        from None


def _timeout(value: Any, what: str) -> float:
  if (not isinstance(value, dict) or not set(value) <= {"seconds", "nanos"}
      or not all(isinstance(v, (int, float)) and 0 <= v < 1e12
                 for v in value.values())):
    raise invalid_argument(f"{what}: timeout must be {{'seconds', 'nanos'}}, "
                           f"got {brief(value)}")
  seconds = value.get("seconds", 0) + value.get("nanos", 0) / 1e9
  if not seconds > 0:
    raise invalid_argument(f"{what}: timeout must be above 0 seconds")
  return float(seconds)
