"""DType: IFRT's DTypeProto kinds and MLIR element types <-> numpy names."""
from __future__ import annotations

import functools
from typing import Any

from jax_pathways.status import invalid_argument, unimplemented
from jax_pathways.wire import protos

_KIND_TO_NAME = {
    "KIND_PRED": "bool", "KIND_S2": "int2", "KIND_S4": "int4",
    "KIND_S8": "int8", "KIND_S16": "int16", "KIND_S32": "int32",
    "KIND_S64": "int64", "KIND_U2": "uint2", "KIND_U4": "uint4",
    "KIND_U8": "uint8", "KIND_U16": "uint16", "KIND_U32": "uint32",
    "KIND_U64": "uint64", "KIND_F16": "float16", "KIND_F32": "float32",
    "KIND_F64": "float64", "KIND_BF16": "bfloat16", "KIND_C64": "complex64",
    "KIND_C128": "complex128", "KIND_F8E3M4": "float8_e3m4",
    "KIND_F8E4M3": "float8_e4m3", "KIND_F8E4M3FN": "float8_e4m3fn",
    "KIND_F8E4M3B11FNUZ": "float8_e4m3b11fnuz",
    "KIND_F8E4M3FNUZ": "float8_e4m3fnuz", "KIND_F8E5M2": "float8_e5m2",
    "KIND_F8E5M2FNUZ": "float8_e5m2fnuz", "KIND_F8E8M0FNU": "float8_e8m0fnu",
    "KIND_F4E2M1FN": "float4_e2m1fn",
}


# Strings: only colocated_python's serialized output specs, which workers
# hold on the host (worker/host_strings.py).
STRING = "string"


@functools.cache
def _tables() -> tuple[dict[int, str], dict[str, int], frozenset[int]]:
  """(kind -> name, name -> kind, every kind but KIND_INVALID)."""
  values = protos.enum_values("xla.ifrt.DTypeProto.Kind")
  to_name = {values[k]: n for k, n in _KIND_TO_NAME.items() if k in values}
  to_kind = {n: k for k, n in to_name.items()}
  to_kind[STRING] = values["KIND_STRING"]
  return (to_name, to_kind, frozenset(v for v in values.values() if v))


def name_of(dtype_proto: Any, strings: bool = False) -> str:
  """xla.ifrt.DTypeProto -> numpy dtype name, e.g. 'bfloat16'; STRING too
  where `strings`."""
  to_name, to_kind, kinds = _tables()
  if dtype_proto.kind not in kinds:
    raise invalid_argument(f"dtype kind {dtype_proto.kind} is not a dtype")
  if strings and dtype_proto.kind == to_kind[STRING]:
    return STRING
  if dtype_proto.kind not in to_name:
    raise unimplemented(
        f"dtype kind {dtype_proto.kind} (e.g. strings, tokens) is not "
        "supported by jax_pathways")
  return to_name[dtype_proto.kind]


def to_proto(name: str, out: Any) -> None:
  _, to_kind, _ = _tables()
  out.kind = to_kind[name]


_ITEM_BITS = {"bool": 8, "int2": 8, "uint2": 8, "int4": 8, "uint4": 8,
              "float4_e2m1fn": 8, "bfloat16": 16, "float16": 16}


def itemsize(name: str) -> int:
  """Bytes per element on the host (sub-byte types use one byte each;
  strings, whose elements vary, are counted as one byte each)."""
  if name == STRING:
    return 1
  if name in _ITEM_BITS:
    return _ITEM_BITS[name] // 8
  if name.startswith("float8"):
    return 1
  import numpy as np  # pylint: disable=import-outside-toplevel
  return np.dtype(name).itemsize


# MLIR element types, as programs write them -> numpy dtype names.
_MLIR_NAMES = {
    "i1": "bool", "i4": "int4", "i8": "int8", "i16": "int16", "i32": "int32",
    "i64": "int64", "ui4": "uint4", "ui8": "uint8", "ui16": "uint16",
    "ui32": "uint32", "ui64": "uint64", "f16": "float16", "f32": "float32",
    "f64": "float64", "bf16": "bfloat16", "complex<f32>": "complex64",
    "complex<f64>": "complex128", "f8E4M3FN": "float8_e4m3fn",
    "f8E5M2": "float8_e5m2", "f8E4M3FNUZ": "float8_e4m3fnuz",
    "f8E5M2FNUZ": "float8_e5m2fnuz", "f8E4M3B11FNUZ": "float8_e4m3b11fnuz",
    "f8E3M4": "float8_e3m4", "f8E4M3": "float8_e4m3",
    "f8E8M0FNU": "float8_e8m0fnu", "f4E2M1FN": "float4_e2m1fn",
    "i2": "int2", "ui2": "uint2",
}


def from_mlir(element_type: Any) -> str | None:
  """The numpy dtype name of an MLIR element type; None if not an array's."""
  return _MLIR_NAMES.get(str(element_type))


def tensor_type(t: Any) -> tuple[tuple[int, ...], str] | None:
  """(shape, dtype name) of a statically shaped MLIR tensor type, else None
  (a token, an unranked or dynamic tensor, an unknown element type)."""
  from jaxlib.mlir import ir  # pylint: disable=import-outside-toplevel
  try:
    rt = ir.RankedTensorType(t)
  except ValueError:
    return None
  name = from_mlir(rt.element_type)
  if name is None or not rt.has_static_shape:
    return None
  return tuple(rt.shape), name
