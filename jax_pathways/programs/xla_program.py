"""XlaProgram: an SPMD StableHLO program, placed onto the island that runs it.

The client compiles for global device ids (its device assignment). A worker
knows only its local devices, so placing a program finds the one island that
holds all of them and rewrites the device assignment into that island's local
indices. The StableHLO itself is passed on untouched: the worker compiles the
very bytes the client's jaxlib wrote.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from jax_pathways import protos
from jax_pathways.resources.island import Island
from jax_pathways.resources.topology import Topology
from jax_pathways.status import invalid_argument, unimplemented

XLA_PROGRAM = "xla::ifrt::XlaProgram"
IFRT_IR_PROGRAM = "xla::ifrt::IfrtIRProgram"
XLA_COMPILE_OPTIONS = "xla::ifrt::XlaCompileOptions"


@dataclasses.dataclass(frozen=True)
class IslandProgram:
  """One island's program: what a worker compiles."""
  island: Island
  program: bytes                 # StableHLO portable artifact
  options: bytes                 # xla.CompileOptionsProto, island-local ids
  devices: tuple[int, ...]       # global ids in the program's logical order

  @property
  def local_devices(self) -> list[int]:
    return [self.island.local_index(d) for d in self.devices]

  @property
  def key(self) -> str:
    """Same program, options and devices -> same key: compile once."""
    h = hashlib.sha256()
    for part in (self.program, self.options, repr(self.devices).encode()):
      h.update(len(part).to_bytes(8, "little"))
      h.update(part)
    return h.hexdigest()


def device_assignment(build_options: Any) -> list[int]:
  """Global device ids in logical order (replica-major), or [] if unset."""
  if not build_options.HasField("device_assignment"):
    return []
  da = build_options.device_assignment
  if len(da.computation_devices) != da.computation_count:
    raise invalid_argument("malformed device assignment in compile options")
  return [da.computation_devices[c].replica_device_ids[r]
          for r in range(da.replica_count)
          for c in range(da.computation_count)]


def place(program: Any, compile_options: Any, topology: Topology
          ) -> IslandProgram:
  """Places a CompileRequest's program (xla.ifrt.Serialized) on one island."""
  if program.type_name == IFRT_IR_PROGRAM:
    raise unimplemented(
        "MPMD programs (IFRT IR) are not supported yet by this controller")
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
  devices = device_assignment(build)
  if not devices:
    n = max(1, build.num_replicas) * max(1, build.num_partitions)
    devices = list(range(n))
  island = topology.place(devices, "the program's device assignment")

  local = options.__class__()
  local.CopyFrom(options)
  da = local.executable_build_options.device_assignment
  da.Clear()
  replicas = max(1, build.num_replicas)
  partitions = len(devices) // replicas
  da.replica_count = replicas
  da.computation_count = partitions
  for c in range(partitions):
    cd = da.computation_devices.add()
    cd.replica_device_ids.extend(
        island.local_index(devices[r * partitions + c]) for r in range(replicas))
  return IslandProgram(island, program.data, local.SerializeToString(),
                       tuple(devices))
