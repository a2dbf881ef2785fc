"""PjrtBackend: runs programs and moves arrays on this worker's devices.

Execution goes through jaxlib's own PJRT CPU client, the same XLA that lowered
the client's program, so results are bit-identical to running the program in
the client's process. This module is the only one in the worker that touches
jaxlib; another device backend (a PJRT C-API plugin, see BUILD.md) replaces
it behind the same methods.
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
from typing import Any, Sequence

import numpy as np

import jax
from jax._src import core as jax_core
from jax._src import sharding_impls
from jax._src.interpreters import mlir
from jax._src.lax import linalg
from jax._src.lib import _jax
from jax._src.lib import xla_client as xc
from jax._src.lib.mlir import ir


def np_dtype(name: str) -> np.dtype:
  return np.dtype(jax.numpy.dtype(name))


@dataclasses.dataclass
class Program:
  """A compiled program and what is needed to run it fast."""
  executable: Any
  devices: tuple[Any, ...]
  out_handlers: list[Any]
  metadata: dict[str, Any]


class PjrtBackend:
  """One worker's devices, compiled programs and the arrays they produce."""

  def __init__(self):
    # Programs lowered by the client may call LAPACK kernels, whose function
    # pointers jaxlib fills in lazily in the process that lowers; this one
    # only runs them (as jax.export does for deserialized modules).
    linalg.initialize_lapack()
    self.client = jax.devices()[0].client
    self.devices = tuple(sorted(jax.local_devices(), key=lambda d: d.id))
    self._cache: dict[str, Program] = {}  # compile key -> Program
    self._ir_context = mlir.make_ir_context()

  # ----------------------------------------------------------------- sharding
  def sharding(self, spec: dict[str, Any]) -> jax.sharding.Sharding:
    """{'devices': [local ids], 'op_sharding': base64 | None} -> Sharding."""
    devices = tuple(self.devices[i] for i in spec["devices"])
    memory_kind = spec.get("memory_kind")
    if spec.get("op_sharding") is None:
      if len(devices) == 1:
        return jax.sharding.SingleDeviceSharding(devices[0],
                                                 memory_kind=memory_kind)
      return sharding_impls.GSPMDSharding.get_replicated(
          devices, memory_kind=memory_kind)
    op = xc.OpSharding()
    op.ParseFromString(base64.b64decode(spec["op_sharding"]))
    return sharding_impls.GSPMDSharding(devices, op, memory_kind=memory_kind)

  # ----------------------------------------------------------------- programs
  def compile(self, program: bytes, options: bytes,
              device_ids: Sequence[int]) -> Program:
    key = hashlib.sha256(program + b"|" + options + b"|" +
                         repr(tuple(device_ids)).encode()).hexdigest()
    cached = self._cache.get(key)
    if cached is not None:
      return cached
    devices = tuple(self.devices[i] for i in device_ids)
    compile_options = xc.CompileOptions.ParseFromString(options)
    executable = self.client.compile_and_load(
        program, xc.DeviceList(devices), compile_options)
    outputs, donated = self._signature(program)
    out_shardings = executable.get_output_shardings()
    handlers = []
    for i, (shape, dtype) in enumerate(outputs):
      if out_shardings is None:
        sharding = (jax.sharding.SingleDeviceSharding(devices[0])
                    if len(devices) == 1 else
                    sharding_impls.GSPMDSharding.get_replicated(devices))
      else:
        sharding = sharding_impls.GSPMDSharding(devices, out_shardings[i])
      aval = jax_core.ShapedArray(shape, np_dtype(dtype))
      handlers.append(xc.array_result_handler(aval, sharding, committed=True,
                                              _skip_checks=True))
    metadata = self._metadata(executable, outputs)
    metadata["donated_input_indices"] = donated
    prog = Program(executable, devices, handlers, metadata)
    self._cache[key] = prog
    return prog

  def execute(self, program: Program, args: Sequence[jax.Array]) -> list[jax.Array]:
    results = program.executable.execute_sharded(list(args))
    return results.consume_with_handlers(program.out_handlers)

  def _signature(self, program: bytes
                 ) -> tuple[list[tuple[tuple[int, ...], str]], list[int]]:
    """Global result shapes/dtypes of @main and the parameters it donates."""
    with self._ir_context:
      try:
        module = _jax.mlir.deserialize_portable_artifact(program,
                                                         self._ir_context)
      except Exception:  # pylint: disable=broad-except
        module = ir.Module.parse(program)  # plain bytecode or text
      for op in module.body.operations:
        if ir.StringAttr(op.attributes["sym_name"]).value != "main":
          continue
        ftype = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
        outputs = []
        for t in ftype.results:
          rt = ir.RankedTensorType(t)
          outputs.append((tuple(rt.shape), _mlir_dtype(rt.element_type)))
        donated = []
        if "arg_attrs" in op.attributes:
          for i, attrs in enumerate(ir.ArrayAttr(op.attributes["arg_attrs"])):
            attrs = ir.DictAttr(attrs)
            if "tf.aliasing_output" in attrs or "jax.buffer_donor" in attrs:
              donated.append(i)
        return outputs, donated
    raise ValueError("the program has no public function @main")

  @staticmethod
  def _metadata(executable: Any, outputs: list[tuple[tuple[int, ...], str]]
                ) -> dict[str, Any]:
    def shardings(lst):
      if lst is None:
        return None
      return [base64.b64encode(s.SerializeToString()).decode() for s in lst]

    def layouts(fn):
      try:
        return [list(l._xla_layout().minor_to_major()) for l in fn()]  # pylint: disable=protected-access
      except Exception as e:  # pylint: disable=broad-except
        return {"error": str(e)}

    try:
      cost = {k: float(v) for k, v in (executable.cost_analysis() or {}).items()}
    except Exception:  # pylint: disable=broad-except
      cost = {}
    stats = executable.get_compiled_memory_stats()
    return {
        "fingerprint": _fingerprint(executable),
        "outputs": [{"shape": list(s), "dtype": d} for s, d in outputs],
        "output_shardings": shardings(executable.get_output_shardings()),
        "parameter_shardings": shardings(executable.get_parameter_shardings()),
        "output_layouts": layouts(executable.get_output_layouts),
        "parameter_layouts": layouts(executable.get_parameter_layouts),
        "output_memory_kinds": [list(k) for k in
                                executable.get_output_memory_kinds()],
        "cost_analysis": cost,
        "hlo_text": executable.hlo_modules()[0].to_string(),
        "memory_stats": {f: getattr(stats, f) for f in _MEMORY_STATS_FIELDS},
        "code_size": executable.size_of_generated_code_in_bytes(),
    }

  # ----------------------------------------------------------------- arrays
  def put(self, data: memoryview, dtype: str, shape: Sequence[int],
          sharding: jax.sharding.Sharding,
          strides: Sequence[int] | None) -> jax.Array:
    host = np.frombuffer(data, dtype=np_dtype(dtype))
    if strides is None:
      host = host.reshape(tuple(shape))
    else:
      host = np.lib.stride_tricks.as_strided(host, tuple(shape), tuple(strides))
    # `host` views the op's payload and keeps it alive for as long as the
    # device array may alias it (PJRT CPU can put without copying).
    return jax.device_put(host, sharding)

  def assemble(self, shape: Sequence[int], sharding: jax.sharding.Sharding,
               parts: Sequence[jax.Array]) -> jax.Array:
    """An array from single-device arrays, one per device of `sharding`."""
    by_device = {p.sharding._device_assignment[0]: p for p in parts}  # pylint: disable=protected-access
    ordered = [by_device[d] for d in sharding._device_assignment]  # pylint: disable=protected-access
    return jax.make_array_from_single_device_arrays(tuple(shape), sharding,
                                                    ordered)

  @staticmethod
  def shards(array: jax.Array) -> list[jax.Array]:
    """Single-device arrays in the order of the array's device list."""
    by_device = {s.device: s.data for s in array.addressable_shards}
    return [by_device[d] for d in array.sharding._device_assignment]  # pylint: disable=protected-access

  @staticmethod
  def to_host(array: jax.Array, strides: Sequence[int] | None = None) -> bytes:
    host = np.asarray(array)
    if strides is not None and tuple(strides) != host.strides:
      out = np.empty_like(host)
      view = np.lib.stride_tricks.as_strided(
          np.frombuffer(out.data, dtype=host.dtype), host.shape, tuple(strides))
      view[...] = host
      return out.tobytes()
    return np.ascontiguousarray(host).tobytes()


_MEMORY_STATS_FIELDS = (
    "generated_code_size_in_bytes", "argument_size_in_bytes",
    "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
    "host_generated_code_size_in_bytes", "host_argument_size_in_bytes",
    "host_output_size_in_bytes", "host_alias_size_in_bytes",
    "host_temp_size_in_bytes")

_MLIR_DTYPES = {
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


def _mlir_dtype(element_type: Any) -> str:
  name = str(element_type)
  if name not in _MLIR_DTYPES:
    raise ValueError(f"unsupported result element type {name}")
  return _MLIR_DTYPES[name]


def _fingerprint(executable: Any) -> str:
  fp = executable.fingerprint
  if isinstance(fp, bytes):
    return base64.b64encode(fp).decode()
  return ""
