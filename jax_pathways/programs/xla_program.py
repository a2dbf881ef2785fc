"""XlaProgram: an SPMD StableHLO program, placed onto the islands that run it.

The client compiles for global device ids (its device assignment). Placing a
program finds the islands holding those devices; each of their workers
compiles the very bytes the client's jaxlib wrote, with the device
assignment rewritten (by the worker) into the devices it knows. The
client's ids are those of its virtual slice; placing maps them to physical
devices. A program
within one island runs on that island's own client; one that spans islands
runs as one SPMD program on every island's worker, gang-launched. Placing
reads the program first: a program the controller cannot read, or whose
custom calls the islands may not run, goes no further
(programs/custom_calls.py).
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable, Sequence

from jax_pathways import validation
from jax_pathways.programs import custom_calls
from jax_pathways.resources.island import Island
from jax_pathways.resources.topology import Topology
from jax_pathways.resources.virtual_slice import VirtualSlice
from jax_pathways.status import invalid_argument, unimplemented
from jax_pathways.wire import protos

XLA_PROGRAM = "xla::ifrt::XlaProgram"
XLA_COMPILE_OPTIONS = "xla::ifrt::XlaCompileOptions"


@dataclasses.dataclass(frozen=True)
class PlacedProgram:
  """A program and where it runs: what each island's worker compiles."""
  islands: tuple[Island, ...]
  program: bytes                 # StableHLO portable artifact
  options: bytes                 # xla.CompileOptionsProto (deterministic)
  devices: tuple[int, ...]       # global ids in the program's logical order
  device_refs: tuple[Any, ...]   # the same, as workers name them
  replicas: int
  # SHA-256 of what makes `program` this program: equal for programs that
  # compile to the same executable (see _read).
  identity: bytes
  # Its callbacks into the client's process (custom_calls.check), and the
  # route the controller serves them by (controller/callback_router.py;
  # 0: none).
  callbacks: custom_calls.Callbacks
  route: int = 0

  @property
  def key(self) -> str:
    """Same program, options and devices -> same key: compile once. A
    program with callbacks is its client's alone (its route)."""
    h = hashlib.sha256()
    for part in (self.identity, self.options, repr(self.devices).encode(),
                 str(self.route).encode()):
      h.update(len(part).to_bytes(8, "little"))
      h.update(part)
    return h.hexdigest()


def device_assignment(build_options: Any, available: int) -> list[int]:
  """Global device ids in logical order (replica-major), or [] if unset.
  Counts are checked against the `available` devices before anything is
  built from them: a client may claim 10**7 partitions."""
  replicas = max(1, build_options.num_replicas)
  partitions = max(1, build_options.num_partitions)
  validation.check_device_count(
      replicas * partitions, available,
      f"compile options: num_replicas {build_options.num_replicas} x "
      f"num_partitions {build_options.num_partitions}")
  if not build_options.HasField("device_assignment"):
    return []
  da = build_options.device_assignment
  if ((da.replica_count, da.computation_count) != (replicas, partitions) or
      len(da.computation_devices) != da.computation_count or
      any(len(c.replica_device_ids) != da.replica_count
          for c in da.computation_devices)):
    raise invalid_argument(
        f"compile options: device assignment of {da.replica_count} replicas "
        f"x {da.computation_count} computations does not match num_replicas "
        f"{replicas} x num_partitions {partitions} or its own lists")
  ids = [da.computation_devices[c].replica_device_ids[r]
         for r in range(da.replica_count)
         for c in range(da.computation_count)]
  validation.check_distinct(ids, "compile options: device assignment")
  return ids


Read = Callable[[bytes], tuple[bytes, custom_calls.Content]]


def place(program: Any, compile_options: Any, topology: Topology,
          spmd_across_islands: bool, devices: VirtualSlice,
          serves_callbacks: bool = False, read: "Read | None" = None
          ) -> PlacedProgram:
  """Places a CompileRequest's program (xla.ifrt.Serialized), compiled by
  the client for the devices of its virtual slice. `serves_callbacks`: the
  client runs callbacks in its process (custom_calls.check). `read`: how
  the program is read (the controller's: programs/reader.py, in a process
  of its own; by default here)."""
  if program.type_name != XLA_PROGRAM:
    raise unimplemented(f"program type {program.type_name!r} is not supported")
  if compile_options.type_name != XLA_COMPILE_OPTIONS:
    raise invalid_argument(
        f"compile options of type {compile_options.type_name!r} do not fit "
        "an XlaProgram")
  xla_options = protos.msg("xla.ifrt.XlaCompileOptionsProto").FromString(
      compile_options.data)
  options = xla_options.compile_options
  build = options.executable_build_options
  virtual = device_assignment(build, devices.size) or list(
      range(max(1, build.num_replicas) * max(1, build.num_partitions)))
  physical = devices.physical(virtual)
  if build.HasField("device_assignment"):
    # Physical ids in the options too: clients whose slices share devices
    # share the compiled program.
    da = build.device_assignment
    for c, computation in enumerate(da.computation_devices):
      computation.replica_device_ids[:] = physical[c::da.computation_count]
  identity, content = (read or _read)(program.data)
  return placed(program.data, options, topology, spmd_across_islands,
                "the program's device assignment", physical,
                identity=identity, content=content,
                serves_callbacks=serves_callbacks)


def _read(program: bytes) -> tuple[bytes, custom_calls.Content]:
  """read(), refusing what does not read."""
  try:
    return read(program)
  except Exception as e:  # pylint: disable=broad-except
    raise invalid_argument(
        f"the program does not read as StableHLO ({str(e)[:300]}); send "
        "what JAX lowers (a StableHLO portable artifact)") from None


def read(program: bytes) -> tuple[bytes, custom_calls.Content]:
  """(what identifies `program`, its custom calls). `program`: a StableHLO
  portable artifact (what JAX's client sends), or MLIR bytecode or text
  (what a worker also compiles), read with the dialects JAX writes; one
  that reads as neither raises, as nothing in it could be checked.

  The identity is the SHA-256 of the program as bytecode without its
  source locations. JAX records the whole Python call stack there, so the same program
  traced again from another call site (pathwaysutils' slice health check
  is traced anew each time it runs, from the caller's stack) differs only
  in them, and compiles to the same executable."""
  from jaxlib.mlir import ir  # pylint: disable=import-outside-toplevel
  from jaxlib.mlir.dialects import stablehlo  # pylint: disable=import-outside-toplevel
  from jax_pathways.programs import mlir_context  # pylint: disable=import-outside-toplevel
  # A context per program (~0.3 ms): a shared one would keep every
  # program's attributes, constants included, for the reader's life.
  context = mlir_context.make()
  try:
    module = stablehlo.deserialize_portable_artifact(context, program)
  except Exception:  # pylint: disable=broad-except
    with context:
      module = ir.Module.parse(program)
  # Nothing elided: programs differing in a large constant must differ.
  identity = module.operation.get_asm(binary=True, enable_debug_info=False,
                                      large_elements_limit=None)
  with context:
    return hashlib.sha256(identity).digest(), custom_calls.read(module)


def check_partition_answer(
    module: bytes, island: Island,
    read: Callable[[bytes], tuple[bytes, custom_calls.Content]]) -> None:
  """Raises INVALID_ARGUMENT unless a custom_partitioning answer (the
  per-device program XLA inlines on `island`'s worker) may go there: read
  as client programs are (`read`: a reader process), it calls only what
  the island runs, no callbacks, and holds no value beyond its memory."""
  _, content = read(module)
  custom_calls.check(content, Topology.custom_call_targets([island]),
                     "The partitioned program", serves_callbacks=False,
                     memory_bytes=island.most_memory)


def placed(program: bytes, compile_options: Any, topology: Topology,
           spmd_across_islands: bool, what: str,
           devices: Sequence[int], content: custom_calls.Content,
           identity: bytes | None = None, serves_callbacks: bool = False,
           label: str = "The program") -> PlacedProgram:
  """`program` with its xla.CompileOptionsProto, placed on the islands that
  hold `devices` (physical ids, in the program's logical order). `content`:
  its custom calls (custom_calls.read), checked against the islands' (as
  `label` in errors). `identity`: the digest the compile cache compares (by
  default, of `program`'s bytes)."""
  replicas = max(1, compile_options.executable_build_options.num_replicas)
  devices = list(devices)
  islands = topology.islands_of(devices, what)
  if len(islands) > 1 and not spmd_across_islands:
    raise unimplemented(
        f"{what} spans islands {[i.id for i in islands]} (devices {devices}) "
        "but this cluster runs programs within one island only")
  callbacks = custom_calls.check(
      content, topology.custom_call_targets(islands), label,
      serves_callbacks=serves_callbacks,
      memory_bytes=(sum(i.most_memory for i in islands)
                    if all(i.most_memory for i in islands) else 0))
  # Deterministic: the client's jaxlib writes the options' map fields (e.g.
  # debug_options' latency-estimator settings) in hash order, which differs
  # from one compile of the same program to the next; the compile cache's
  # key must not.
  return PlacedProgram(tuple(islands), program,
                       compile_options.SerializeToString(deterministic=True),
                       tuple(devices), tuple(topology.device_refs(devices)),
                       replicas,
                       identity or hashlib.sha256(program).digest(),
                       callbacks)
