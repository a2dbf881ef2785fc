"""MpmdExecutable: an MPMD program whose fragments are compiled on their islands.

One Execute of it is one pipeline step: every ifrt.Call becomes a LAUNCH gang
on the islands of its mesh, every ifrt.CopyArrays a move worker to worker,
submitted in program order in one go, so the whole step takes consecutive
places in the order of every island it touches and the workers run it
without waiting for the controller. Arrays between fragments live on the
workers only; they are freed (DELETE, in order after their last use) as soon
as the step is submitted.
"""
from __future__ import annotations

import base64
import threading
from typing import Any, Callable, Sequence

from jax_pathways.controller import moves
from jax_pathways.controller.arrays import Array
from jax_pathways.controller.compile_cache import CompileCache, CompiledProgram
from jax_pathways.controller.dispatcher import OnDone, OpKind
from jax_pathways.controller.gangs import (ARG, RESULT, TEMP, Ref,
                                           Schedule, StepOp)
from jax_pathways.controller.launch_context import LaunchContext
from jax_pathways.programs.ifrt_ir_program import Call, MpmdProgram
from jax_pathways.programs.sharding import Sharding
from jax_pathways.resources.island import Island
from jax_pathways.resources.topology import Topology
from jax_pathways.status import (Status, StatusError, from_exception,
                                 invalid_argument)
from jax_pathways.wire import protos

OnMpmdCompiled = Callable[[Status, "MpmdExecutable | None"], None]
# Steps kept per executable (one per dispatcher epoch and argument layouts).
SCHEDULES_KEPT = 8


def compile_program(program: MpmdProgram, cache: CompileCache,
                    topology: Topology, on_done: OnMpmdCompiled,
                    client: int = 0) -> None:
  """Compiles every fragment (all at once, each once) for `client` and
  then builds the executable; `on_done` gets the first failure instead."""
  compiled: list[CompiledProgram | None] = [None] * len(program.fragments)
  lock = threading.Lock()
  pending = [len(program.fragments)]
  failed: list[Status] = []

  def one_done(i: int, status: Status, result: CompiledProgram | None) -> None:
    with lock:
      if status.ok:
        compiled[i] = result
      else:
        failed.append(Status(status.code, f"fragment "
                             f"{program.fragment_names[i]}: {status.message}"))
      pending[0] -= 1
      if pending[0]:
        return
    try:
      if failed:
        raise StatusError(failed[0].code, failed[0].message)
      exe = MpmdExecutable(program, compiled, topology)  # type: ignore[arg-type]
    except Exception as e:  # pylint: disable=broad-except
      for fragment in compiled:  # held for an executable never made
        if fragment is not None:
          cache.release(fragment)
      on_done(from_exception(e).status, None)
      return
    on_done(Status(), exe)

  for i, fragment in enumerate(program.fragments):
    cache.compile(fragment, lambda s, r, i=i: one_done(i, s, r), client)


class MpmdExecutable:
  """What Execute and the metadata requests need, computed once."""

  def __init__(self, program: MpmdProgram,
               fragments: Sequence[CompiledProgram], topology: Topology):
    self.program = program
    self.fragments = list(fragments)
    self.devices = program.devices
    self._topology = topology
    self.shardings = self._value_shardings()
    # Ids, not Islands: an island whose lost worker was replaced is a new
    # Island (its next generation), and the arrays a step makes must name
    # that one (see islands_of_value).
    self._value_island_ids = [
        tuple(i.id for i in topology.islands_of(v.devices, "an array"))
        for v in program.values]
    values = program.values
    self.outputs = [(values[v].shape, values[v].dtype)
                    for v in program.outputs]
    self.output_shardings = [self.shardings[v] for v in program.outputs]
    self.donated = program.donated_inputs
    self.num_parameters = len(program.inputs)
    self._schedules: dict[Any, Schedule] = {}
    self._check_donation()
    self.metadata = self._metadata()

  def programs(self) -> list[CompiledProgram]:
    """What it holds of the CompileCache: its fragments."""
    return self.fragments
  def islands_of_value(self, v: int) -> tuple[Island, ...]:
    """Value `v`'s islands as they are now."""
    return tuple(self._topology.island(i) for i in self._value_island_ids[v])

  @property
  def output_islands(self) -> list[tuple[Island, ...]]:
    return [self.islands_of_value(v) for v in self.program.outputs]

  # ------------------------------------------------------------- shardings
  def _value_shardings(self) -> list[Sharding]:
    """Every value's sharding: inputs as their first fragment wants them,
    the rest as their producer makes them."""
    program = self.program
    wanted: dict[int, Sharding] = {}
    for step in program.steps:
      if isinstance(step, Call):
        params = self.fragments[step.fragment].parameter_shardings
        for k, v in enumerate(step.args):
          if params is not None and v not in wanted:
            wanted[v] = params[k]
    for step in reversed(program.steps):  # back through copies
      if not isinstance(step, Call):
        for a, r in zip(step.args, step.results):
          if r in wanted and a not in wanted:
            wanted[a] = wanted[r].with_devices(program.values[a].devices)
    shardings: dict[int, Sharding] = {}
    for v in program.inputs:
      shardings[v] = wanted.get(v) or self._untiled(v)
    for step in program.steps:
      if isinstance(step, Call):
        made = self.fragments[step.fragment].output_shardings
        for k, r in enumerate(step.results):
          shardings[r] = made[k]
      else:
        for a, r in zip(step.args, step.results):
          shardings[r] = shardings[a].with_devices(program.values[r].devices)
    return [shardings[v] for v in range(len(program.values))]

  def _untiled(self, v: int) -> Sharding:
    value = self.program.values[v]
    if value.tiled:
      raise invalid_argument(
          f"input {self.program.inputs.index(v)} of the MPMD program is "
          "sharded but no fragment uses it")
    return Sharding(value.devices)

  def _check_donation(self) -> None:
    """A fragment may consume only what nothing uses later: intermediate
    values, and inputs the caller donated."""
    program = self.program
    caller_donated = {program.inputs[i] for i in program.donated_inputs}
    inputs = set(program.inputs)
    last_use: dict[int, int] = {v: len(program.steps) for v in program.outputs}
    for n, step in enumerate(program.steps):
      for v in step.args:
        last_use[v] = max(last_use.get(v, -1), n)
    for n, step in enumerate(program.steps):
      if not isinstance(step, Call):
        continue
      for k in self.fragments[step.fragment].donated:
        v = step.args[k]
        if (v in inputs and v not in caller_donated) or last_use[v] > n:
          raise invalid_argument(
              f"fragment {program.fragment_names[step.fragment]} donates "
              f"its argument {k}, which is still used afterwards (or an "
              "input the caller did not donate)")

  # ---------------------------------------------------------------- execute
  def check_argument(self, i: int, array: Array) -> None:
    expected = self.shardings[self.program.inputs[i]]
    if array.sharding is None or (array.sharding.devices !=
                                  expected.devices):
      got = [] if array.sharding is None else list(array.sharding.devices)
      raise invalid_argument(
          f"argument {i} is on devices {got} but the MPMD program takes it "
          f"on devices {list(expected.devices)}; put it there with "
          "jax.device_put first")
    value = self.program.values[self.program.inputs[i]]
    array.check_fits(i, frozenset(expected.devices),
                     (value.shape, value.dtype), expected)

  def launch(self, context: LaunchContext, args: Sequence[Array],
             results: Sequence[int], on_done: OnDone | None) -> None:
    """Submits one step: `args` -> arrays in the `results` buffers."""
    for fragment in self.fragments:  # a lost island's next worker
      fragment.ensure_current(context)
    self.schedule(context, args).run(context, [a.buffer for a in args],
                                     list(results), on_done)

  def schedule(self, context: LaunchContext, args: Sequence[Array]) -> Schedule:
    """One step as plain data, for arguments laid out as `args` (a move's
    ops name its source's sharding); kept per dispatcher epoch."""
    key = (context.dispatcher.epoch,
           tuple((tuple(i.id for i in a.islands), a.sharding) for a in args))
    made = self._schedules.get(key)
    if made is None:
      if len(self._schedules) >= SCHEDULES_KEPT:
        self._schedules.clear()
      made = self._schedules[key] = self._schedule(context, args)
    return made

  def _schedule(self, context: LaunchContext, args: Sequence[Array]
                ) -> Schedule:
    program = self.program
    topology = context.topology
    schedule = Schedule([])
    ref: dict[int, Ref] = {}
    like: dict[int, Array] = {}  # each value's layout, for moves
    for i, (v, a) in enumerate(zip(program.inputs, args)):
      ref[v], like[v] = (ARG, i), a
    # Outputs produced by a step land in their result buffer directly.
    output_ref: dict[int, Ref] = {}
    for j, v in enumerate(program.outputs):
      if v not in output_ref and v not in ref:
        output_ref[v] = (RESULT, j)
    temps: list[int] = []  # the values in temporaries, in order

    def new(v: int) -> Ref:
      r = output_ref.get(v)
      if r is None:
        r = (TEMP, len(temps))
        temps.append(v)
      value = program.values[v]
      ref[v] = r
      like[v] = Array(0, self.islands_of_value(v), value.dtype, value.shape,
                      self.shardings[v])
      return r

    # A value moved to another island is received just before its first
    # use, not where it is sent: a receive holds its island's op loop, and
    # in a 1F1B steady state the island has a backward to run meanwhile.
    receives: dict[int, list[StepOp]] = {}

    def needed(values: Sequence[int]) -> None:
      for v in values:
        if v in receives:
          schedule.gangs.append(receives.pop(v))

    for step in program.steps:
      needed(step.args)
      if isinstance(step, Call):
        outs = [new(r) for r in step.results]
        schedule.gangs.append(self.fragments[step.fragment].launch_ops(
            [ref[a] for a in step.args], outs, topology))
      else:
        for a, r in zip(step.args, step.results):
          dest = new(r)
          sends, later = schedule.add_move(
              moves.planned(context, like[a], like[r], pull=True), ref[a],
              dest)
          schedule.gangs.append(sends)
          if later:
            receives[r] = later
    needed(list(receives))
    # An output that is an input, or returned twice, gets a copy of its own.
    for j, v in enumerate(program.outputs):
      if output_ref.get(v) != (RESULT, j):
        src = like[v]
        dst = Array(0, src.islands, src.dtype, src.shape, src.sharding)
        sends, later = schedule.add_move(
            moves.planned(context, src, dst, pull=False), ref[v],
            (RESULT, j))
        schedule.gangs.append(sends + later)
    # The temporaries go once the ops queued before on their islands ran.
    by_island: dict[int, list[Ref]] = {}
    for k, v in enumerate(temps):
      for island in self._value_island_ids[v]:
        by_island.setdefault(island, []).append((TEMP, k))
    schedule.gangs.extend([StepOp(island, OpKind.DELETE, args=tuple(refs))]
                          for island, refs in by_island.items())
    schedule.temps = len(temps)
    return schedule

  # --------------------------------------------------------------- metadata
  def _metadata(self) -> dict[str, Any]:
    """The same keys as a CompiledProgram's (what the metadata handlers
    read), for the program as a whole."""
    program = self.program

    def op_sharding(s: Sharding) -> str:
      raw = s.op_sharding
      if raw is None:
        op = protos.msg("xla.OpSharding")(type=0)  # REPLICATED
        raw = op.SerializeToString()
      return base64.b64encode(raw).decode()

    def layout(v: int) -> list[int]:
      return list(range(len(program.values[v].shape)))[::-1]

    return {
        "name": program.name,
        "fingerprint": None,
        "parameter_shardings": [op_sharding(self.shardings[v])
                                for v in program.inputs],
        "output_shardings": [op_sharding(s) for s in self.output_shardings],
        "parameter_layouts": [layout(v) for v in program.inputs],
        "output_layouts": [layout(v) for v in program.outputs],
        "output_memory_kinds": [["device"] * len(program.outputs)],
        "donated_input_indices": list(program.donated_inputs),
        "memory_stats": self._memory_stats(self.fragments),
        "code_size": sum(f.metadata.get("code_size", 0)
                         for f in self.fragments),
        "cost_analysis": self._costs(program.steps),
        "hlo_text": "\n\n".join(f.metadata.get("hlo_text", "")
                                for f in self.fragments),
    }

  def mesh_of(self, fragment: int) -> str:
    devices = self.program.fragments[fragment].devices
    for name, mesh_devices in self.program.meshes.items():
      if tuple(mesh_devices) == tuple(devices):
        return name
    return self.program.fragment_names[fragment]

  def per_mesh(self) -> dict[str, list[int]]:
    """Mesh name -> its fragments."""
    meshes: dict[str, list[int]] = {}
    for i in range(len(self.fragments)):
      meshes.setdefault(self.mesh_of(i), []).append(i)
    return meshes

  def mesh_memory_stats(self) -> dict[str, dict[str, int]]:
    return {mesh: self._memory_stats([self.fragments[i] for i in frags])
            for mesh, frags in self.per_mesh().items()}

  def mesh_costs(self) -> dict[str, dict[str, float]]:
    return {mesh: self._costs([s for s in self.program.steps
                               if isinstance(s, Call) and s.fragment in frags])
            for mesh, frags in self.per_mesh().items()}

  @staticmethod
  def _memory_stats(fragments: Sequence[CompiledProgram]) -> dict[str, int]:
    """Fragments of a step run one after another: the largest of each."""
    stats: dict[str, int] = {}
    for f in fragments:
      for k, v in f.metadata.get("memory_stats", {}).items():
        stats[k] = max(stats.get(k, 0), v)
    return stats

  def _costs(self, steps: Sequence[Any]) -> dict[str, float]:
    """Cost of the calls of one step: the sum over its fragment calls."""
    total: dict[str, float] = {}
    for step in steps:
      if isinstance(step, Call):
        for k, v in self.fragments[step.fragment].metadata.get(
            "cost_analysis", {}).items():
          total[k] = total.get(k, 0.0) + float(v)
    return total

