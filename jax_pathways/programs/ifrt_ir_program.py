"""IfrtIrProgram: an MPMD program, as fragments and the dataflow between them.

An IfrtIRProgram (what `jaxlib._sdy_mpmd.compile_mpmd` sends) is MLIR whose
@main calls per-mesh fragments (`ifrt.Call @frag::@main(...) on devices
[...]`, each fragment a nested SPMD StableHLO module) and moves arrays between
meshes (`ifrt.CopyArrays`). This module reads it into plain data: every
fragment a PlacedProgram on the islands of its mesh, every op of @main a
Call or a Copy over numbered values, in program order, which on each mesh is
the order the partitioner's pipeline schedule chose.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import re
import threading
from typing import Any, Callable, Iterator

from jax_pathways import shardy_mpmd
from jax_pathways import validation
from jax_pathways.programs import custom_calls
from jax_pathways.programs import xla_program
from jax_pathways.programs.xla_program import PlacedProgram
from jax_pathways.resources.topology import Topology
from jax_pathways.resources.virtual_slice import VirtualSlice
from jax_pathways.status import invalid_argument, unimplemented
from jax_pathways.wire import protos

IFRT_IR_PROGRAM = "xla::ifrt::IfrtIRProgram"
IFRT_IR_COMPILE_OPTIONS = "xla::ifrt::IfrtIRCompileOptions"

_ARRAY_TYPE = re.compile(
    r"!ifrt\.array<tensor<([^>]*)>, #ifrt\.sharding_param<([^>]*)>, "
    r"\[([\d, ]*)\]")
_ELEMENT_TYPES = {
    "i1": "bool", "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
    "ui8": "uint8", "ui16": "uint16", "ui32": "uint32", "ui64": "uint64",
    "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
    "complex<f32>": "complex64", "complex<f64>": "complex128",
}


@dataclasses.dataclass(frozen=True)
class ValueType:
  """An array of @main: global shape, dtype and the devices holding it."""
  shape: tuple[int, ...]
  dtype: str
  devices: tuple[int, ...]   # global device ids
  tiled: bool                # its sharding splits some dimension


@dataclasses.dataclass(frozen=True)
class Call:
  """Run fragment `fragment` on `args`, producing `results` (value ids)."""
  fragment: int
  args: tuple[int, ...]
  results: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Copy:
  """Copy `args` onto other devices (their result types say which)."""
  args: tuple[int, ...]
  results: tuple[int, ...]
  donated: bool


Step = Call | Copy


@dataclasses.dataclass(frozen=True)
class MpmdProgram:
  """An IFRT IR program as data. Values are numbered: inputs first."""
  name: str
  fragments: tuple[PlacedProgram, ...]
  fragment_names: tuple[str, ...]
  meshes: dict[str, tuple[int, ...]]     # mesh name -> global device ids
  steps: tuple[Step, ...]
  values: tuple[ValueType, ...]
  inputs: tuple[int, ...]
  outputs: tuple[int, ...]
  donated_inputs: tuple[int, ...]        # positions in `inputs`
  devices: tuple[int, ...]               # every device, in the client's order


def place(program: Any, compile_options: Any, topology: Topology,
          spmd_across_islands: bool, devices: VirtualSlice,
          vet: Callable[[bytes], None] | None = None) -> MpmdProgram:
  """Reads a CompileRequest's IfrtIRProgram (xla.ifrt.Serialized). `vet`
  reads its MLIR first where reading it cannot hurt (the controller's:
  programs/reader.py); raises if it cannot be read."""
  if compile_options.type_name != IFRT_IR_COMPILE_OPTIONS:
    raise invalid_argument(
        f"compile options of type {compile_options.type_name!r} do not fit "
        "an IfrtIRProgram")
  proto = protos.msg("xla.ifrt.IfrtIrProgramProto").FromString(program.data)
  if proto.HasField("ifrt_version") and proto.ifrt_version:
    raise unimplemented("versioned (VIFRT) IFRT IR programs are not "
                        "supported; send the unversioned MLIR bytecode")
  options = protos.msg("xla.ifrt.IfrtIrCompileOptionsProto").FromString(
      compile_options.data)
  field = "IFRT IR compile options: device_ids"
  validation.check_device_count(len(options.device_ids), devices.size, field)
  validation.check_distinct(options.device_ids, field)
  if vet is not None:
    vet(proto.ifrt_program)
  return _Reader(topology, spmd_across_islands,
                 list(devices.physical(options.device_ids)),
                 options.compile_option_overrides).read(proto.ifrt_program)


class _Reader:
  """One program's walk over its @main."""

  def __init__(self, topology: Topology, spmd_across_islands: bool,
               device_ids: list[int], overrides: Any):
    for d in device_ids:
      topology.island_of_device(d)  # a clear error for unknown devices
    self._topology = topology
    self._spmd_across_islands = spmd_across_islands
    self._device_ids = device_ids
    self._overrides = overrides
    self._values: dict[Any, int] = {}   # ir.Value -> id
    self._types: list[ValueType] = []
    self._fragments: dict[tuple[str, tuple[int, ...]], int] = {}
    self._placed: list[PlacedProgram] = []
    self._names: list[str] = []
    self._meshes: dict[str, tuple[int, ...]] = {}

  def read(self, bytecode: bytes) -> MpmdProgram:
    from jaxlib.mlir import ir  # pylint: disable=import-outside-toplevel
    with _context() as ctx, ir.Location.unknown(ctx):
      try:
        module = ir.Module.parse(bytecode)
      except Exception as e:  # pylint: disable=broad-except
        raise invalid_argument(f"unreadable IFRT IR program: {e}") from None
      nested = {}
      main = None
      for op in module.body.operations:
        name = op.operation.name
        if name == "builtin.module":
          nested[ir.StringAttr(op.attributes["sym_name"]).value] = op
        elif (name == "func.func" and
              ir.StringAttr(op.attributes["sym_name"]).value == "main"):
          main = op
      if main is None:
        raise invalid_argument("the IFRT IR program has no @main")
      block = main.regions[0].blocks[0]
      inputs = tuple(self._value(a) for a in block.arguments)
      donated = _donated_arguments(main)
      steps: list[Step] = []
      outputs: tuple[int, ...] = ()
      for op in block.operations:
        kind = op.operation.name
        if kind == "ifrt.Call":
          steps.append(self._call(op, nested))
        elif kind == "ifrt.CopyArrays":
          steps.append(Copy(self._ids(op.operands), self._new(op.results),
                            "donated" in op.attributes and
                            str(op.attributes["donated"]) == "true"))
        elif kind == "func.return":
          outputs = self._ids(op.operands)
        else:
          raise unimplemented(
              f"IFRT IR op {kind} is not supported (jax_pathways runs "
              "ifrt.Call and ifrt.CopyArrays)")
      label = _string(module.operation.attributes, "sym_name", "mpmd")
    return MpmdProgram(label, tuple(self._placed), tuple(self._names),
                       dict(self._meshes), tuple(steps), tuple(self._types),
                       inputs, outputs, donated, tuple(self._device_ids))

  # ----------------------------------------------------------------- values
  def _value(self, value: Any) -> int:
    text = str(value.type)
    m = _ARRAY_TYPE.match(text)
    if m is None:
      raise unimplemented(f"IFRT IR value of type {text} is not supported")
    tensor, sharding, devices = m.groups()
    *dims, element = tensor.split("x") if tensor else [""]
    if element not in _ELEMENT_TYPES:
      raise unimplemented(f"element type {element} is not supported")
    logical = [int(d) for d in devices.split(",") if d.strip()]
    tiles = sharding.split(" to ")[0]
    type_ = ValueType(tuple(int(d) for d in dims), _ELEMENT_TYPES[element],
                      tuple(self._global(logical)),
                      any(int(t) > 1 for t in tiles.split("x") if t))
    self._values[value] = len(self._types)
    self._types.append(type_)
    return self._values[value]

  def _new(self, results: Any) -> tuple[int, ...]:
    return tuple(self._value(r) for r in results if not _is_control(r))

  def _ids(self, operands: Any) -> tuple[int, ...]:
    return tuple(self._values[v] for v in operands if not _is_control(v))

  def _global(self, logical: list[int]) -> list[int]:
    try:
      return [self._device_ids[i] for i in logical]
    except IndexError:
      raise invalid_argument(
          f"IFRT IR names logical devices {logical} but the program has "
          f"{len(self._device_ids)} devices") from None

  # -------------------------------------------------------------- fragments
  def _call(self, op: Any, nested: dict[str, Any]) -> Call:
    callee = str(op.attributes["callee"])  # @module::@main
    module_name = callee.split("::")[0].lstrip("@").strip('"')
    if module_name not in nested:
      raise invalid_argument(f"ifrt.Call names unknown program {callee}")
    logical = [int(x) for x in re.findall(r"\d+", str(op.attributes["devices"]))]
    devices = tuple(self._global(logical))
    mesh = _string(op.attributes, "ifrt.mesh_name", module_name)
    known = self._meshes.setdefault(mesh, devices)
    if known != devices:
      raise invalid_argument(f"mesh {mesh!r} names devices {list(known)} "
                             f"and {list(devices)}")
    key = (module_name, devices)
    if key not in self._fragments:
      options_key = _string(op.attributes, "ifrt.compile_options_key",
                            f"{module_name}_mesh_{mesh}")
      label = f"Fragment {module_name} on mesh {mesh!r}"
      content = custom_calls.read(nested[module_name])
      if content.needs_client:
        raise unimplemented(
            f"{label} calls back into Python (jax.debug.print, callbacks, "
            "inspect_array_sharding or custom_partitioning): jax_pathways "
            "serves callbacks in SPMD programs, not yet inside MPMD "
            "pipeline stages")
      self._fragments[key] = len(self._placed)
      self._placed.append(xla_program.placed(
          _standalone(nested[module_name], len(devices)),
          self._options(options_key, devices), self._topology,
          self._spmd_across_islands,
          f"fragment {module_name} on mesh {mesh!r}", devices,
          content=content, label=label))
      self._names.append(module_name)
    return Call(self._fragments[key], self._ids(op.operands),
                self._new(op.results))

  def _options(self, key: str, devices: tuple[int, ...]) -> Any:
    """The fragment's xla.CompileOptionsProto, on global device ids."""
    options = protos.msg("xla.CompileOptionsProto")()
    if key in self._overrides:
      options.CopyFrom(self._overrides[key])
    build = options.executable_build_options
    build.num_replicas = 1
    build.num_partitions = len(devices)
    build.use_spmd_partitioning = True
    build.use_shardy_partitioner = True  # fragments carry sdy shardings
    da = build.device_assignment
    da.Clear()
    da.replica_count = 1
    da.computation_count = len(devices)
    for d in devices:
      da.computation_devices.add().replica_device_ids.append(d)
    return options


def parse(bytecode: bytes) -> None:
  """Reads an IFRT IR program's MLIR (raises if it does not read)."""
  from jaxlib.mlir import ir  # pylint: disable=import-outside-toplevel
  with _context() as ctx, ir.Location.unknown(ctx):
    ir.Module.parse(bytecode)


def _standalone(module_op: Any, num_devices: int) -> bytes:
  """A nested fragment module as a program of its own (MLIR bytecode)."""
  from jaxlib.mlir import ir  # pylint: disable=import-outside-toplevel
  module = ir.Module.parse(module_op.operation.get_asm(enable_debug_info=False))
  attributes = module.operation.attributes
  if "sym_visibility" in attributes:
    del attributes["sym_visibility"]
  i32 = ir.IntegerType.get_signless(32)
  attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(i32, num_devices)
  attributes["mhlo.num_replicas"] = ir.IntegerAttr.get(i32, 1)
  out = io.BytesIO()
  module.operation.write_bytecode(file=out)
  return out.getvalue()


def _donated_arguments(main: Any) -> tuple[int, ...]:
  from jaxlib.mlir import ir  # pylint: disable=import-outside-toplevel
  if "arg_attrs" not in main.attributes:
    return ()
  return tuple(i for i, attrs in enumerate(ir.ArrayAttr(main.attributes["arg_attrs"]))
               if "ifrt.donated" in ir.DictAttr(attrs))


def _string(attributes: Any, name: str, default: str) -> str:
  """The string attribute `name`, else `default`."""
  from jaxlib.mlir import ir  # pylint: disable=import-outside-toplevel
  if name not in attributes:
    return default
  return ir.StringAttr(attributes[name]).value


def _is_control(value: Any) -> bool:
  return str(value.type).startswith("!ifrt.control")


# One MLIR context for all programs: parsing happens on the session thread.
_lock = threading.Lock()

# A tiny MPMD module: lowering it loads the IFRT dialect into the context
# (JAX's contexts register stablehlo, sdy and mpmd but not ifrt; without it
# the bytecode parses, but ifrt.Call loses its callee and devices).
_PRELOAD = """module {
  func.func public @main(%arg0: !mpmd.mesh_tensor<"m", tensor<1xf32>>)
      -> !mpmd.mesh_tensor<"m", tensor<1xf32>>
      attributes {topology = #mpmd.topology<<"m" : <["x"=1]>>>} {
    return %arg0 : !mpmd.mesh_tensor<"m", tensor<1xf32>>
  }
}"""


@functools.cache  # called under _lock; not cached if it raises
def _load_context() -> Any:
  extension = shardy_mpmd.load()
  if extension is None:
    raise unimplemented("this controller cannot read IFRT IR programs: "
                        f"{shardy_mpmd.unavailable_reason()}")
  from jaxlib.mlir import ir  # pylint: disable=import-outside-toplevel
  from jax_pathways.programs import mlir_context  # pylint: disable=import-outside-toplevel
  ctx = mlir_context.make()
  with ctx, ir.Location.unknown():
    extension.lower_to_ifrt(ir.Module.parse(_PRELOAD))
  return ctx


@contextlib.contextmanager
def _context() -> Iterator[Any]:
  """The shared context, IFRT dialect loaded, held by this thread."""
  with _lock:
    ctx = _load_context()
    with ctx:
      yield ctx
