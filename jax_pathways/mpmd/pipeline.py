"""Pipeline: a marked training step, partitioned over meshes, called like jit.

    step = mpmd.pipeline(train_step, topology, stages={"enc": 0, "dec": 1},
                         schedule="1F1B", microbatches=8, batch_argnums=(2,))
    params, opt_state, loss = step(params, opt_state, batch)
    print(step.schedule)

The batch arguments are split into `microbatches` equal parts along their
first axis before the step sees them: inside, each is a list of microbatches
(for `mpmd.value_and_grad`). Donated arguments (`donate_argnums`, e.g. the
parameters and optimizer state) are updated in place on their islands;
using them afterwards is an error, as with jax.jit. The first call for given shapes lowers the step,
partitions it with the Shardy MPMD partitioner (or, where jaxlib lacks it,
with jax_pathways' own splitter: `partitioner` says which ran) and compiles
it; later calls only move the arguments onto their meshes when they are not
there yet and launch the step.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from jax_pathways import shardy_mpmd
from jax_pathways.mpmd import fallback
from jax_pathways.mpmd import lowering
from jax_pathways.mpmd import schedule as schedule_lib
from jax_pathways.mpmd import shardy
from jax_pathways.mpmd.plan import Plan
from jax_pathways.mpmd.meshes import Topology

SHARDY, OWN = "shardy", "jax_pathways"


class Pipeline:
  """A pipeline-parallel step; see the module docstring."""

  def __init__(self, fn: Callable[..., Any], topology: Topology,
               stages: Mapping[str, str | int], *, schedule: str = "1F1B",
               microbatches: int, batch_argnums: Sequence[int] = (),
               donate_argnums: Sequence[int] = (),
               data_parallel: bool = True,
               partitioning_options: Mapping[str, str | bool] | None = None,
               partitioner: str = "auto"):
    if not isinstance(topology, Topology):
      raise TypeError("topology must be a jax_pathways.mpmd.Topology")
    if not isinstance(microbatches, int) or microbatches < 1:
      raise ValueError(f"microbatches must be a positive int, not "
                       f"{microbatches!r}")
    if partitioner not in ("auto", SHARDY, OWN):
      raise ValueError(f"partitioner must be 'auto', {SHARDY!r} or {OWN!r}")
    if not stages:
      raise ValueError("stages must assign every stage to a mesh")
    self.fn = fn
    self.topology = topology
    self.stage_meshes = {s: topology.mesh_of(s, t) for s, t in stages.items()}
    self.schedule_name = schedule_lib.canonical(schedule)
    self.microbatches = microbatches
    self.batch_argnums = tuple(batch_argnums)
    self.donate_argnums = tuple(donate_argnums)
    self.data_parallel = data_parallel
    self.partitioning_options = dict(partitioning_options or {})
    if partitioner == "auto":
      partitioner = SHARDY if shardy_mpmd.load() is not None else OWN
    elif partitioner == SHARDY and shardy_mpmd.load() is None:
      raise RuntimeError("the Shardy MPMD partitioner is not available: "
                         f"{shardy_mpmd.unavailable_reason()}")
    self.partitioner = partitioner
    if partitioner == OWN:
      fallback.check_supported(self.schedule_name, self.stage_meshes)
    self._plans: dict[Any, Plan] = {}
    self._last: Plan | None = None

  # ------------------------------------------------------------------ calls
  def __call__(self, *args: Any) -> Any:
    split = self._split(args)
    plan = self._plan(split)
    leaves = jax.tree.leaves(split)
    placed = [_place(x, s) for x, s in zip(leaves, plan.input_shardings)]
    return jax.tree.unflatten(plan.out_tree, plan.run(placed))

  def lower(self, *args: Any) -> "Pipeline":
    """Partitions and compiles for these arguments (or their shapes) without
    running; `schedule` is then available."""
    self._plan(self._split(args, abstract=True))
    return self

  @property
  def _last_plan(self) -> Plan:
    if self._last is None:
      raise RuntimeError("call the pipeline (or .lower(*args)) first")
    return self._last

  @property
  def input_shardings(self) -> list[NamedSharding]:
    """Where the last call's flattened arguments (batch arguments split into
    microbatches) live; arguments already there are not moved."""
    return list(self._last_plan.input_shardings)

  @property
  def schedule(self) -> schedule_lib.Schedule:
    """The schedule the last call ran (or lower() planned)."""
    return self._last_plan.schedule

  @property
  def ifrt_ir(self) -> str:
    """The IFRT IR program (MLIR text) the last call ran: its @main calls
    one fragment per scheduled task on its mesh and copies arrays between
    meshes, in each mesh's schedule order."""
    if self._last_plan.ifrt_ir is None:
      raise RuntimeError(f"the {self.partitioner!r} partitioner runs the "
                         "step fragment by fragment, not as an IFRT IR "
                         "program")
    return self._last_plan.ifrt_ir

  # --------------------------------------------------------------- planning
  def _split(self, args: Sequence[Any], abstract: bool = False
             ) -> tuple[Any, ...]:
    m = self.microbatches
    out = list(args)
    for i in self.batch_argnums:
      if i >= len(args):
        raise ValueError(f"batch_argnums names argument {i} but the step "
                         f"got {len(args)} arguments")
      leaves, tree = jax.tree.flatten(args[i])
      for leaf in leaves:
        if not np.shape(leaf) or np.shape(leaf)[0] % m:
          raise ValueError(
              f"argument {i}: a batch of shape {np.shape(leaf)} cannot be "
              f"split into {m} microbatches along its first axis")
      parts = [_split_leaf(leaf, m, abstract) for leaf in leaves]
      out[i] = [jax.tree.unflatten(tree, [p[k] for p in parts])
                for k in range(m)]
    return tuple(out)

  def _plan(self, split: tuple[Any, ...]) -> Plan:
    leaves, tree = jax.tree.flatten(split)
    key = tree, tuple((np.shape(x), jnp.result_type(x)) for x in leaves)
    plan = self._plans.get(key)
    if plan is None:
      abstract = jax.tree.map(
          lambda x: jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x)),
          split)
      plan = (self._shardy_plan(abstract) if self.partitioner == SHARDY else
              fallback.plan(self.fn, self.topology, self.stage_meshes,
                            self.schedule_name, self.microbatches, abstract))
      self._plans[key] = plan
    self._last = plan
    return plan

  def lowering_shardings(self, split: tuple[Any, ...]) -> Any:
    """How the step is lowered: on the first mesh, microbatches split over
    its first axis when every mesh has the same shape (data parallelism
    inside each stage), everything else replicated."""
    meshes = list(self.topology.meshes.values())
    first = meshes[0]
    same = all(dict(m.shape) == dict(first.shape) for m in meshes)
    axis = first.axis_names[0]
    size = first.shape[axis]
    replicated = NamedSharding(first, PartitionSpec())
    shardings = []
    for i, arg in enumerate(split):
      def one(x: Any, batch: bool = i in self.batch_argnums) -> NamedSharding:
        if (batch and self.data_parallel and same and size > 1 and
            np.ndim(x) and np.shape(x)[0] % size == 0):
          return NamedSharding(first, PartitionSpec(axis))
        return replicated
      shardings.append(jax.tree.map(one, arg))
    return tuple(shardings)

  def donated_leaves(self, split: tuple[Any, ...]) -> list[int]:
    """Positions, among the flattened arguments, of the donated ones."""
    out, start = [], 0
    for i, arg in enumerate(split):
      n = len(jax.tree.leaves(arg))
      if i in self.donate_argnums:
        out.extend(range(start, start + n))
      start += n
    return out

  def _shardy_plan(self, abstract: tuple[Any, ...]) -> Plan:
    """The step for arguments of these shapes and dtypes (microbatches
    split), by the Shardy MPMD partitioner."""
    jitted = jax.jit(self.fn, in_shardings=self.lowering_shardings(abstract),
                     keep_unused=True)
    traced = jitted.trace(*abstract)
    out_info = traced.out_info
    lowered_jax = traced.lower()
    extension = shardy_mpmd.load()
    lowered = lowering.to_mpmd(lowered_jax.compiler_ir("stablehlo"),
                               extension.clone_mlir_module)
    unknown = set(lowered.stage_names) - set(self.stage_meshes)
    if unknown:
      raise ValueError(f"stages {sorted(unknown)} have no mesh; assign them "
                       "in stages={...}")
    partitioned = shardy.partition(lowered, self.topology,
                                   self.stage_meshes, self.schedule_name,
                                   self.partitioning_options,
                                   self.donated_leaves(abstract))
    out_leaves, out_tree = jax.tree.flatten(out_info)
    avals = [jax.core.ShapedArray(o.shape, o.dtype) for o in out_leaves]
    backend = self.topology.devices()[0].client
    executable = shardy.compile_ifrt(partitioned, backend,
                                     self.topology.devices(), avals)
    return Plan(partitioned.schedule, executable.execute,
                 partitioned.input_shardings, out_tree,
                 str(partitioned.ifrt_module))


def pipeline(fn: Callable[..., Any], topology: Topology,
             stages: Mapping[str, str | int], **kwargs: Any) -> Pipeline:
  """`Pipeline(fn, topology, stages, ...)`; see Pipeline."""
  return Pipeline(fn, topology, stages, **kwargs)


@functools.cache
def _splitter(m: int) -> Callable[[Any], Any]:
  return jax.jit(lambda x: jnp.split(x, m))


def _split_leaf(leaf: Any, m: int, abstract: bool) -> list[Any]:
  if abstract or isinstance(leaf, jax.ShapeDtypeStruct):
    shape = (np.shape(leaf)[0] // m,) + tuple(np.shape(leaf)[1:])
    return [jax.ShapeDtypeStruct(shape, jnp.result_type(leaf))] * m
  if isinstance(leaf, jax.Array):
    return list(_splitter(m)(leaf))
  return np.split(np.asarray(leaf), m)


def _place(x: Any, sharding: NamedSharding) -> Any:
  if isinstance(x, jax.Array) and x.sharding.is_equivalent_to(sharding,
                                                              x.ndim):
    return x
  return jax.device_put(x, sharding)
