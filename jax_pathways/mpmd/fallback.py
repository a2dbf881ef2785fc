"""jax_pathways' own splitter, for when jaxlib lacks the Shardy partitioner.

It works on the step's jaxpr: calls are inlined down to the stage calls
(`mpmdstage__<name>__<f|b|p>` jits, each tagged with its microbatch), every
stage call runs on its stage's mesh, and every other equation runs where
most of its inputs live (or, with none placed yet, where its first consumer
runs). Equations are then issued in an order that is a valid topological
order whose restriction to each mesh is the textbook GPipe or 1F1B order
(schedule.py); neighbouring equations of one mesh form one jitted fragment.
Fragments and the copies between meshes are issued from this process
without waiting: the controller orders them on each island and the workers
run them as their inputs arrive.

Compared with the Shardy path: one request per fragment instead of one per
step, and arrays are replicated within each mesh (no data parallelism inside
a stage).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.extend.core as jex_core
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jax_pathways.mpmd import schedule as schedule_lib
from jax_pathways.mpmd import stages
from jax_pathways.mpmd.plan import Plan
from jax_pathways.mpmd.meshes import Topology

SUPPORTED = ("GPipe", "1F1B")
_STAGE = re.compile(rf"^{stages.STAGE_PREFIX}(\w+?)__([fbp])$")
_MICROBATCH = re.compile(rf"^{stages.MICROBATCH_PREFIX}(\d+)__$")


def check_supported(schedule: str, stage_meshes: Mapping[str, str]) -> None:
  if schedule not in SUPPORTED:
    raise ValueError(
        f"schedule {schedule!r} needs the Shardy MPMD partitioner; "
        f"jax_pathways' own splitter offers {list(SUPPORTED)}")
  meshes = list(stage_meshes.values())
  if len(set(meshes)) != len(meshes):
    raise ValueError("jax_pathways' own splitter runs one stage per mesh")


# An atom: ("key", id) for a value computed in the step, ("lit", value).
Atom = tuple[str, Any]


def _keys(atoms: Sequence[Atom]) -> list[int]:
  """The ids of the computed values among `atoms`."""
  return [k for kind, k in atoms if kind == "key"]


@dataclasses.dataclass
class _Node:
  """One equation of the flattened step."""
  eqn: Any
  inputs: list[Atom]
  outputs: list[int]
  stage: str | None = None
  kind: str | None = None        # F / B for stage calls
  microbatch: int | None = None
  mesh: str | None = None


class _Flattener:
  """Inlines calls down to stage calls, numbering every value."""

  def __init__(self) -> None:
    self.nodes: list[_Node] = []
    self._next = 0

  def key(self) -> int:
    self._next += 1
    return self._next

  def run(self, jaxpr: Any, consts: Sequence[Any], inputs: Sequence[Atom],
          microbatch: int | None) -> list[Atom]:
    env: dict[Any, Atom] = {v: ("lit", c)
                            for v, c in zip(jaxpr.constvars, consts)}
    env.update(zip(jaxpr.invars, inputs))

    def read(x: Any) -> Atom:
      return ("lit", x.val) if isinstance(x, jex_core.Literal) else env[x]

    for eqn in jaxpr.eqns:
      ins = [read(x) for x in eqn.invars]
      name = str(eqn.params.get("name", ""))
      stage = _STAGE.match(name) if eqn.primitive.name in ("jit", "pjit") else None
      if eqn.primitive.name in ("jit", "pjit") and stage is None:
        m = _MICROBATCH.match(name)
        inner = eqn.params["jaxpr"]
        outs = self.run(inner.jaxpr, inner.consts, ins,
                        int(m.group(1)) if m else microbatch)
      elif eqn.primitive.name == "custom_vjp_call":
        inner = eqn.params["call_jaxpr"]
        outs = self.run(inner.jaxpr, inner.consts, ins, microbatch)
      else:
        keys = [self.key() for _ in eqn.outvars]
        node = _Node(eqn, ins, keys)
        if stage is not None:
          node.stage = stage.group(1)
          node.kind = "B" if stage.group(2) == stages.BACKWARD else "F"
          node.microbatch = microbatch
        self.nodes.append(node)
        outs = [("key", k) for k in keys]
      for v, o in zip(eqn.outvars, outs):
        if not isinstance(v, jex_core.DropVar):
          env[v] = o
    return [read(v) for v in jaxpr.outvars]


def _place_nodes(nodes: list[_Node], stage_meshes: Mapping[str, str],
                 first_mesh: str) -> None:
  """Stage calls on their stage's mesh; other equations where most of
  their input bytes are, else where their first consumer runs."""
  producer: dict[int, _Node] = {k: n for n in nodes for k in n.outputs}
  for node in nodes:
    if node.stage is not None:
      if node.stage not in stage_meshes:
        raise ValueError(f"stage {node.stage!r} has no mesh; assign it in "
                         "stages={...}")
      node.mesh = stage_meshes[node.stage]
  for node in nodes:
    if node.mesh is not None:
      continue
    weight: dict[str, int] = {}
    for k in _keys(node.inputs):
      if k in producer and producer[k].mesh is not None:
        aval = _aval_of(producer[k], k)
        mesh = producer[k].mesh
        weight[mesh] = weight.get(mesh, 0) + int(np.prod(aval.shape) or 1)
    if weight:
      node.mesh = max(weight, key=lambda m: (weight[m], -list(weight).index(m)))
  consumers: dict[int, list[_Node]] = {}
  for node in nodes:
    for k in _keys(node.inputs):
      consumers.setdefault(k, []).append(node)
  for node in reversed(nodes):
    if node.mesh is None:
      placed = [c.mesh for k in node.outputs for c in consumers.get(k, [])
                if c.mesh is not None]
      node.mesh = placed[0] if placed else first_mesh


def _aval_of(node: _Node, key: int) -> Any:
  return node.eqn.outvars[node.outputs.index(key)].aval


def _order(nodes: list[_Node], plan: schedule_lib.Schedule,
           inputs: set[int]) -> list[_Node]:
  """A topological order of the nodes whose stage calls follow `plan` on
  every mesh; everything else goes as early as its inputs allow."""
  expected = {m: [(t.kind, t.microbatch) for t in tasks]
              for m, tasks in plan.meshes.items()}
  ready = set(inputs)
  remaining = list(nodes)
  out = []
  while remaining:
    for i, node in enumerate(remaining):
      if not ready.issuperset(_keys(node.inputs)):
        continue
      if node.stage is not None:
        queue = expected.get(node.mesh, [])
        if queue and queue[0] != (node.kind, node.microbatch):
          continue
        if queue:
          queue.pop(0)
      out.append(node)
      ready.update(node.outputs)
      del remaining[i]
      break
    else:
      raise ValueError(
          "the step's data dependencies contradict the pipeline schedule "
          f"(next expected per mesh: { {m: q[:1] for m, q in expected.items()} })")
  return out


@dataclasses.dataclass
class _Fragment:
  mesh: str
  nodes: list[_Node]
  inputs: list[int] = dataclasses.field(default_factory=list)
  outputs: list[int] = dataclasses.field(default_factory=list)
  fn: Callable[..., Any] | None = None


def _fragments(order: list[_Node], out_keys: set[int]) -> list[_Fragment]:
  """Neighbouring equations of one mesh form a fragment; a stage call is a
  fragment of its own (the unit the schedule orders). A fragment returns
  what later fragments or the step's outputs use."""
  fragments: list[_Fragment] = []
  last_use: dict[int, int] = {}   # key -> index of the last fragment using it
  for node in order:
    last = fragments[-1] if fragments else None
    if (node.stage is None and last is not None and last.mesh == node.mesh and
        last.nodes[-1].stage is None):
      last.nodes.append(node)
    else:
      fragments.append(_Fragment(node.mesh, [node]))
    for k in _keys(node.inputs):
      last_use[k] = len(fragments) - 1
  for i, fragment in enumerate(fragments):
    made = [k for n in fragment.nodes for k in n.outputs]
    for n in fragment.nodes:
      for k in _keys(n.inputs):
        if k not in made and k not in fragment.inputs:
          fragment.inputs.append(k)
    fragment.outputs = [k for k in made
                        if k in out_keys or last_use.get(k, -1) > i]
  return fragments


def _evaluate(nodes: list[_Node], inputs: list[int], outputs: list[int]
              ) -> Callable[..., Any]:
  def run(*args: Any) -> list[Any]:
    env = dict(zip(inputs, args))
    for node in nodes:
      vals = [v if kind == "lit" else env[v] for kind, v in node.inputs]
      outs = node.eqn.primitive.bind(*vals, **node.eqn.params)
      if not node.eqn.primitive.multiple_results:
        outs = [outs]
      env.update(zip(node.outputs, outs))
    return [env[k] for k in outputs]
  return run


def plan(fn: Callable[..., Any], topology: Topology,
         stage_meshes: Mapping[str, str], schedule_name: str,
         microbatches: int, abstract: tuple[Any, ...]) -> Plan:
  """`fn`'s step for arguments of the shapes and dtypes `abstract`
  (microbatches split), by this splitter, with `stage_meshes` (stage ->
  mesh name) as the pipeline has them."""
  closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*abstract)
  flat = _Flattener()
  input_keys = [flat.key() for _ in closed.jaxpr.invars]
  out_atoms = flat.run(closed.jaxpr, closed.consts,
                       [("key", k) for k in input_keys], None)
  nodes = flat.nodes
  _place_nodes(nodes, stage_meshes, topology.names[0])
  mesh_stages = {m: s for s, m in stage_meshes.items()}
  meshes = [m for m in topology.names if m in mesh_stages]
  textbook = (schedule_lib.gpipe if schedule_name == "GPipe" else
              schedule_lib.one_f_one_b)(
                  meshes, [mesh_stages[m] for m in meshes],
                  microbatches)
  order = _order(nodes, textbook, set(input_keys))

  fragments = _fragments(order, set(_keys(out_atoms)))
  input_mesh: dict[int, str] = {}   # where each input is first used
  for fragment in fragments:
    for k in fragment.inputs:
      if k in input_keys:
        input_mesh.setdefault(k, fragment.mesh)
  shardings = {m: NamedSharding(mesh, PartitionSpec())
               for m, mesh in topology.meshes.items()}
  compiled: dict[Any, Callable[..., Any]] = {}
  for fragment in fragments:
    node = fragment.nodes[0]
    # A stage call (a fragment of its own) compiles once per mesh; any
    # other fragment on its own.
    key = ((fragment.mesh, id(node.eqn.params.get("jaxpr")),
            tuple(str(a) for a in node.eqn.params.items()))
           if node.stage is not None else id(fragment))
    if key not in compiled:
      compiled[key] = jax.jit(_evaluate(fragment.nodes, fragment.inputs,
                                        fragment.outputs),
                              out_shardings=shardings[fragment.mesh])
    fragment.fn = compiled[key]
  tasks: dict[str, list[schedule_lib.Task]] = {m: [] for m in meshes}
  for node in order:
    if node.stage is not None:
      tasks[node.mesh].append(schedule_lib.Task(node.kind, node.microbatch,
                                                (node.stage,)))
  schedule = schedule_lib.Schedule(
      f"{schedule_name} (jax_pathways splitter)",
      {m: tuple(t) for m, t in tasks.items()})

  def run(args: list[Any]) -> list[Any]:
    env: dict[int, Any] = dict(zip(input_keys, args))
    where: dict[int, str] = dict(input_mesh)
    for fragment in fragments:
      target = shardings[fragment.mesh]
      ins = []
      for k in fragment.inputs:
        value = env[k]
        if where.get(k) != fragment.mesh:  # a copy between meshes
          value = jax.device_put(value, target)
        ins.append(value)
      env.update(zip(fragment.outputs, fragment.fn(*ins)))
      where.update({k: fragment.mesh for k in fragment.outputs})
    return [jnp.asarray(v) if kind == "lit" else env[v]
            for kind, v in out_atoms]

  first = topology.names[0]
  input_shardings = [shardings[input_mesh.get(k, first)] for k in input_keys]
  return Plan(schedule, run, input_shardings,
               jax.tree.structure(out_shape))
