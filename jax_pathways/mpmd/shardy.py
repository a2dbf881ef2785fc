"""Partitioning with jaxlib's Shardy MPMD partitioner (shardy_mpmd.py).

    lowered module --IMPORT|OPTIMIZE--> fragments, scheduled per mesh
                   --PARTITION-------> MPMD module --lower_to_ifrt--> IFRT IR

The schedule is read between the two phases, from the fragments themselves,
so `Schedule` shows what will run. The IFRT IR program is compiled through
the proxy backend: the controller receives it as an IfrtIRProgram.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Sequence

from jax.sharding import NamedSharding, PartitionSpec

from jax_pathways import shardy_mpmd
from jax_pathways.mpmd import schedule as schedule_lib
from jax_pathways.mpmd.lowering import Lowered
from jax_pathways.mpmd.meshes import Topology


@dataclasses.dataclass
class Partitioned:
  ifrt_module: Any
  schedule: schedule_lib.Schedule
  input_shardings: list[NamedSharding]
  output_shardings: list[NamedSharding]


def options_for(schedule: str, extra: Mapping[str, str | bool]
                ) -> dict[str, str | bool]:
  """The partitioning options for a (canonical) schedule name."""
  options: dict[str, str | bool] = {"mpmd_pipeline_schedule": schedule}
  if schedule in schedule_lib.SPLIT_BACKWARD:
    options["mpmd_split_bwd_fragments"] = True
  for key, value in extra.items():
    if not isinstance(value, (str, bool)):
      raise TypeError(f"partitioning option {key!r} must be a str or bool")
    options[key] = value
  return options


def assignment_for(stage_meshes: Mapping[str, str], schedule: str
                   ) -> dict[str, str | tuple[str, int]]:
  """Stage -> mesh; interleaved schedules also need each stage's position."""
  if schedule in schedule_lib.INTERLEAVED:
    return {s: (m, i) for i, (s, m) in enumerate(stage_meshes.items())}
  return dict(stage_meshes)


def partition(lowered: Lowered, topology: Topology,
              stage_meshes: Mapping[str, str], schedule: str,
              extra_options: Mapping[str, str | bool],
              donated: Sequence[int]) -> Partitioned:
  extension = shardy_mpmd.load()
  assert extension is not None
  options = options_for(schedule, extra_options)
  common = dict(
      func_name="main", named_meshes=topology.shape(),
      assignment=assignment_for(stage_meshes, schedule), input_meshes=[],
      output_meshes=[], donate_argnums=list(donated),
      partitioning_options=options,
      fragment_merge_rules=[], fragment_schedule_rules=[])
  phase = extension.PartitioningPhase
  module = extension.clone_mlir_module(lowered.module)
  scheduled = extension.apply_mpmd_partitioning(
      module, phases=phase.IMPORT | phase.OPTIMIZE, **common).mpmd_module
  plan = read_schedule(scheduled, schedule)
  result = extension.apply_mpmd_partitioning(
      extension.clone_mlir_module(scheduled), phases=phase.PARTITION,
      **common)
  ifrt = extension.clone_mlir_module(result.mpmd_module)
  extension.lower_to_ifrt(ifrt)
  specs = result.module_io_sharding_specs_and_meshes
  return Partitioned(ifrt, plan,
                     [_named(topology, s) for s in specs.input_specs],
                     [_named(topology, s) for s in specs.output_specs])


def compile_ifrt(partitioned: Partitioned, backend: Any,
                 devices: Sequence[Any], out_avals: Sequence[Any]) -> Any:
  """The IFRT IR program, compiled on `backend` (the proxy: our controller)."""
  extension = shardy_mpmd.load()
  assert extension is not None
  module = extension.clone_mlir_module(partitioned.ifrt_module)
  return extension.compile_mpmd(
      backend, module, list(devices), list(out_avals),
      list(partitioned.output_shardings),
      xla_compile_options=extension.get_compile_options(module, {}))


def _named(topology: Topology, spec: Any) -> NamedSharding:
  dims = [None if not axes else axes[0] if len(axes) == 1 else tuple(axes)
          for axes in spec.tensor_spec]
  return NamedSharding(topology.meshes[spec.mesh_name], PartitionSpec(*dims))


_ORIGIN = re.compile(r'user_origin<"([^"]*)"(?:\((\d+)\))?>')


def read_schedule(module: Any, name: str) -> schedule_lib.Schedule:
  """Each mesh's fragments, in order, from a scheduled MPMD module."""
  from jaxlib.mlir import ir  # pylint: disable=import-outside-toplevel
  meshes: dict[str, list[schedule_lib.Task]] = {}
  for fn in module.body.operations:
    if (fn.operation.name != "func.func" or
        ir.StringAttr(fn.attributes["sym_name"]).value != "main"):
      continue
    for op in fn.regions[0].blocks[0].operations:
      if op.operation.name != "mpmd.fragment":
        continue
      attrs = op.attributes
      origins = _ORIGIN.findall(str(attrs["origin"]))
      stages = tuple(dict.fromkeys(n for n, _ in origins))
      transposes = {int(t or 0) for _, t in origins}
      counter = (int(str(attrs["call_counter"]).split(":")[0])
                 if "call_counter" in attrs else None)
      if counter is None or len(transposes) != 1 or not stages:
        task = schedule_lib.Task("?", None, stages or ("inferred",))
      elif "remat" in attrs:
        task = schedule_lib.Task("R", counter, stages)
      elif transposes == {0}:
        task = schedule_lib.Task("F", counter, stages)
      else:
        split = ("a" if "split_keep_transferred" in attrs else
                 "w" if "split_drop_transferred" in attrs else "")
        task = schedule_lib.Task("B" + split, counter, stages)
      mesh = ir.StringAttr(attrs["mesh_name"]).value
      meshes.setdefault(mesh, []).append(task)
  return schedule_lib.Schedule(name, {m: tuple(t) for m, t in meshes.items()})
