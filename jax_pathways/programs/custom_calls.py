"""Custom calls: what a program may make XLA call, checked before it compiles.

A program is input like any request field. Its custom calls name functions
in the compiling process, and some carry references into the process that
lowered them: JAX's `InspectSharding` holds a raw function pointer and
argument, `CustomSPMDPartitioning` a key into a dict of the client's
Python callbacks, a host callback an index into callables handed to the
compiler beside the program. A worker's XLA would follow them as they
came. So every program is read before any worker compiles it (the
controller, `check`), and again by the worker (defence in depth): only the
targets on the islands' allow-list pass, and the ones jax_pathways serves
itself (host and compile-time callbacks, run in the client's process:
worker/callback_binding.py) only from a client that serves them, with their
indices bound and their configs in the shape JAX writes.

The allow-list of a platform is what the island's jaxlib registers as
plain kernels (LAPACK on CPU; the solver, PRNG and kernel libraries of a
GPU plugin), which each worker reports when it joins, and XLA's own
partitioning and placement markers, which name no function.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Iterable

from jax_pathways.status import invalid_argument

# JAX's host callbacks on CPU and GPU: FFI calls whose typed backend config
# holds `index`, the position of the callable handed to the compiler.
HOST_CALLBACKS = frozenset({
    "xla_ffi_python_cpu_callback", "xla_ffi_partitioned_python_cpu_callback",
    "xla_ffi_python_gpu_callback", "xla_ffi_partitioned_python_gpu_callback",
})
# Called by XLA's SPMD partitioner while it compiles.
INSPECT_SHARDING = "InspectSharding"
CUSTOM_PARTITIONING = "CustomSPMDPartitioning"
COMPILE_TIME = frozenset({INSPECT_SHARDING, CUSTOM_PARTITIONING})
SERVED = HOST_CALLBACKS | COMPILE_TIME
# Markers XLA itself consumes while partitioning and placing a program:
# they call nothing.
XLA_MARKERS = frozenset({
    "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape",
    "annotate_device_placement", "MoveToHost", "MoveToDevice",
    "LayoutConstraint", "AllocateBuffer", "ApproxTopK", "TopK",
})
# The module attribute the client's jax_pathways sets on a program whose
# host callbacks it serves: "<table>:<count>" (client/host_callbacks.py).
TABLE_ATTRIBUTE = "jax_pathways.host_callbacks"
_TABLE = re.compile(r"^(\d{1,18}):(\d{1,6})$")
# JAX keys custom partitioning by id() of its callback record.
_PARTITIONING_KEY = re.compile(rb"^\d{1,24}$")
# encode_inspect_sharding_callback: a function pointer and its argument.
INSPECT_KEY_BYTES = 16
# Bounds on what a program may make the controller keep per program.
MAX_CALLBACKS = 1 << 16


@dataclasses.dataclass(frozen=True)
class CustomCall:
  """One stablehlo.custom_call of a program, as far as the checks read it."""
  target: str
  backend_config: bytes      # the string config (compile-time callbacks)
  index: int | None          # a host callback's `index`; None if unreadable


@dataclasses.dataclass(frozen=True)
class Content:
  """What a program asks beyond plain StableHLO."""
  calls: tuple[CustomCall, ...] = ()
  table: str | None = None   # the TABLE_ATTRIBUTE value, unchecked
  largest_value: int = 0     # bytes of the largest statically shaped value

  @property
  def host_callbacks(self) -> tuple[CustomCall, ...]:
    return tuple(c for c in self.calls if c.target in HOST_CALLBACKS)

  @property
  def compile_time(self) -> tuple[CustomCall, ...]:
    return tuple(c for c in self.calls if c.target in COMPILE_TIME)

  @property
  def needs_client(self) -> bool:
    """The program calls back into its client's process."""
    return any(c.target in SERVED for c in self.calls)


@dataclasses.dataclass(frozen=True)
class Callbacks:
  """A checked program's callbacks: the client table they are bound to
  (None: no host callbacks) and how many callables it has."""
  table: int | None
  count: int
  compile_time: bool

  @property
  def any(self) -> bool:
    return self.table is not None or self.compile_time


def read(module: Any) -> Content:
  """The custom calls and largest value of an MLIR module (jaxlib.mlir.ir),
  in its context."""
  from jaxlib.mlir import ir  # pylint: disable=import-outside-toplevel
  calls: list[CustomCall] = []
  largest = [0]

  def visit(op: Any) -> Any:
    for result in op.results:
      size = _static_bytes(ir, result.type)
      if size > largest[0]:
        largest[0] = size
    if op.name == "stablehlo.custom_call":
      calls.append(_custom_call(ir, op))
    return ir.WalkResult.ADVANCE

  module.operation.walk(visit)
  table = _attribute(module.operation.attributes, TABLE_ATTRIBUTE,
                     ir.StringAttr)
  return Content(tuple(calls), None if table is None else table.value,
                 largest[0])


def _custom_call(ir: Any, op: Any) -> CustomCall:
  attributes = op.attributes
  target = ir.StringAttr(attributes["call_target_name"]).value
  config = _attribute(attributes, "backend_config", ir.StringAttr)
  typed = _attribute(attributes, "mhlo.backend_config", ir.DictAttr)
  index = None if typed is None else _attribute(typed, "index",
                                                 ir.IntegerAttr)
  return CustomCall(target, b"" if config is None else config.value_bytes,
                    None if index is None else int(index.value))


def _attribute(attributes: Any, name: str, kind: type) -> Any:
  """The attribute `name` if it is there and a `kind`, else None."""
  value = attributes[name] if name in attributes else None
  return value if isinstance(value, kind) else None


def _static_bytes(ir: Any, t: Any) -> int:
  if not isinstance(t, ir.RankedTensorType) or not t.has_static_shape:
    return 0
  width = getattr(t.element_type, "width", 32)
  size = max(1, (width + 7) // 8)
  for d in t.shape:
    size *= d
  return size


@functools.lru_cache(maxsize=None)
def registered(platform: str) -> frozenset[str]:
  """The custom call targets this process's jaxlib registers as kernels for
  `platform` ("cpu", "cuda", "rocm"): what a worker on it can run."""
  names: set[str] = set()
  modules: list[str] = (["jaxlib.lapack", "jaxlib.cpu_sparse"]
                        if platform == "cpu" else
                        ["jaxlib.gpu_solver", "jaxlib.gpu_prng",
                         "jaxlib.gpu_linalg", "jaxlib.gpu_sparse",
                         "jaxlib.gpu_rnn", "jaxlib.gpu_triton"])
  wanted = {"cpu": "cpu", "cuda": "CUDA", "rocm": "ROCM"}.get(platform)
  for name in modules:
    try:
      module = __import__(name, fromlist=["registrations"])
      by_platform = module.registrations()
    except Exception:  # pylint: disable=broad-except
      continue  # this jaxlib lacks the plugin: nothing of it registered
    for key, targets in by_platform.items():
      if key == wanted:
        names.update(t[0] for t in targets)
  return frozenset(names)


def allowed(registered_targets: Iterable[str]) -> frozenset[str]:
  """The allow-list of islands whose jaxlib registers `registered_targets`."""
  return frozenset(registered_targets) | XLA_MARKERS | SERVED


def check(content: Content, allow: frozenset[str], what: str, *,
          serves_callbacks: bool, memory_bytes: int = 0) -> Callbacks:
  """Raises INVALID_ARGUMENT, naming the target and what to do, unless
  every custom call of `content` may run on islands with allow-list
  `allow`, for a client that serves callbacks or not; returns the
  program's callbacks. `memory_bytes`: the islands' memory (0: unchecked);
  a program with a value larger than that could never run."""
  if memory_bytes and content.largest_value > memory_bytes:
    raise invalid_argument(
        f"{what} has a value of {content.largest_value} bytes, more than "
        f"the {memory_bytes} bytes of memory of the islands it runs on")
  for call in content.calls:
    if call.target not in allow:
      raise invalid_argument(
          f"{what} calls custom call target {call.target!r}, which the "
          "islands do not run: jax_pathways runs the kernels the workers' "
          "jaxlib registers, XLA's partitioning markers and JAX's "
          "callbacks. A target registered only in the client's process "
          "(jax.ffi.register_ffi_target) does not exist on the workers: "
          "write it with JAX operations, or register it on every worker")
  if not content.needs_client:
    if content.table is not None:
      raise invalid_argument(f"{what} names host callbacks "
                             f"({TABLE_ATTRIBUTE}) but calls none")
    return Callbacks(None, 0, False)
  if not serves_callbacks:
    kinds = sorted({_kind(c.target) for c in content.calls
                    if c.target in SERVED})
    raise invalid_argument(
        f"{what} calls back into Python in the client's process "
        f"({', '.join(kinds)}), and this client does not serve callbacks: "
        "only a client that runs jax_pathways in its own process can "
        "(import jax_pathways; jax_pathways.initialize(address)); a client "
        "that reaches the controller through JAX's proxy backend alone "
        "(pathwaysutils, JAX_PLATFORMS=proxy) cannot")
  table, count = _table(content, what)
  for call in content.calls:
    if call.target in HOST_CALLBACKS:
      if call.index is None or not 0 <= call.index < count:
        raise invalid_argument(
            f"{what}: host callback {call.target} names callable index "
            f"{call.index}, but the program's client bound {count}; a host "
            "callback without its callable is never run")
    elif call.target == INSPECT_SHARDING:
      if len(call.backend_config) != INSPECT_KEY_BYTES:
        raise invalid_argument(
            f"{what}: {INSPECT_SHARDING} carries a backend config of "
            f"{len(call.backend_config)} bytes, not the "
            f"{INSPECT_KEY_BYTES}-byte key JAX writes")
    elif call.target == CUSTOM_PARTITIONING:
      if not _PARTITIONING_KEY.match(call.backend_config):
        raise invalid_argument(
            f"{what}: {CUSTOM_PARTITIONING} carries backend config "
            f"{call.backend_config[:40]!r}, not the key JAX writes")
  return Callbacks(table, count, bool(content.compile_time))


def _table(content: Content, what: str) -> tuple[int | None, int]:
  """(table, count) of a program's host callbacks: (None, 0) without."""
  if not content.host_callbacks:
    return None, 0
  if content.table is None:
    raise invalid_argument(
        f"{what} has host callbacks but names no callables for them "
        f"({TABLE_ATTRIBUTE}): it was not compiled through jax_pathways' "
        "client, so nothing could run them")
  m = _TABLE.match(content.table)
  if m is None or not 0 < int(m.group(2)) <= MAX_CALLBACKS:
    raise invalid_argument(f"{what}: {TABLE_ATTRIBUTE} = "
                           f"{content.table[:40]!r} is not '<table>:<count>' "
                           f"with 1..{MAX_CALLBACKS} callables")
  return int(m.group(1)), int(m.group(2))


def _kind(target: str) -> str:
  if target in HOST_CALLBACKS:
    return ("jax.debug.print, jax.debug.callback, jax.pure_callback or "
            "io_callback")
  if target == INSPECT_SHARDING:
    return "jax.debug.inspect_array_sharding"
  return "jax.experimental.custom_partitioning"
