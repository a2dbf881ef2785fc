"""Pipeline-parallel training over the two islands of the test cluster,
compared with plain JAX on the local CPU."""
import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_pathways
from jax_pathways import admin, mpmd

pytestmark = pytest.mark.integration

M = 8
STEPS = 4


def _train(step, model, steps=STEPS):
  params, losses = model.params, []
  for _ in range(steps):
    params, loss = step(params, (model.x, model.y))
    losses.append(float(loss))
  return params, losses


def _reference(model, cpu_devices, steps=STEPS):
  cpu = cpu_devices[0]
  params = jax.device_put(model.params, cpu)
  x, y = jax.device_put(model.x, cpu), jax.device_put(model.y, cpu)
  losses = []
  for _ in range(steps):
    params, loss = model.reference_step(params, x, y)
    losses.append(float(loss))
  return params, losses


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_training_matches_plain_jit(schedule, mlp, rel_err, proxy_devices,
                                    cpu_devices):
  model = mlp(stages=2, microbatches=M)
  step = mpmd.pipeline(model.train_step, mpmd.Topology.islands(),
                       stages={"s0": 0, "s1": 1}, schedule=schedule,
                       microbatches=M, batch_argnums=(1,))
  params, losses = _train(step, model)
  ref_params, ref_losses = _reference(model, cpu_devices)
  assert step.partitioner == "shardy"
  for got, want in zip(losses, ref_losses):
    assert abs(got - want) <= 1e-5 * abs(want), (losses, ref_losses)
  assert losses[-1] < losses[0]
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
    assert rel_err(got, want) <= 1e-5
  # The parameters stay on their stage's island between steps.
  assert {d.slice_index for d in params[0][0].sharding.device_set} == {0}
  assert {d.slice_index for d in params[-1][0].sharding.device_set} == {1}


def test_same_bits_as_the_same_step_jitted_locally(mlp, proxy_devices,
                                                   cpu_devices):
  """Where the math is the same (the marked step, data-parallel over 4
  devices per stage), the pipeline reproduces jax.jit bit for bit."""
  model = mlp(stages=2, microbatches=M)
  step = mpmd.pipeline(model.train_step, mpmd.Topology.islands(),
                       stages={"s0": 0, "s1": 1}, schedule="1F1B",
                       microbatches=M, batch_argnums=(1,))
  params, loss = step(model.params, (model.x, model.y))

  mesh = Mesh(np.array(cpu_devices[:4]), ("data",))
  replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  xs, ys = np.split(model.x, M), np.split(model.y, M)
  batches = [(jax.device_put(a, split), jax.device_put(b, split))
             for a, b in zip(xs, ys)]
  local = jax.jit(model.train_step)(jax.device_put(model.params, replicated),
                                    batches)
  np.testing.assert_array_equal(np.asarray(loss), np.asarray(local[1]))
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(local[0])):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_schedule_is_data_and_what_the_islands_run(mlp, proxy_devices):
  model = mlp(stages=2, microbatches=M)
  step = mpmd.pipeline(model.train_step, mpmd.Topology.islands(),
                       stages={"s0": 0, "s1": 1}, schedule="1f1b",
                       microbatches=M, batch_argnums=(1,))
  params, _ = step(model.params, (model.x, model.y))   # compiled outside
  textbook = mpmd.schedule.one_f_one_b(["island0", "island1"], ["s0", "s1"],
                                       M)
  assert step.schedule.meshes == textbook.meshes
  assert step.schedule.order("island1")[:4] == ["F0", "B0", "F1", "B1"]
  assert "island0: F0 F1 B0 F2 B1" in str(step.schedule)
  # The IFRT IR program behind it: one call per task, copies between meshes.
  tasks = sum(len(t) for t in step.schedule.meshes.values())
  assert step.ifrt_ir.count("ifrt.Call @") == tasks
  assert "ifrt.CopyArrays" in step.ifrt_ir

  with jax_pathways.trace() as t:
    _, loss = step(params, (model.x, model.y))
    loss.block_until_ready()
  for island in (0, 1):
    ran = ["B" if "_bwd_" in op.name else "F" for op in t.launches(island)]
    planned = [task.kind for task in step.schedule.meshes[f"island{island}"]]
    assert ran == planned, (island, ran, planned)
    # Activations and gradients arrive from the other island, worker to
    # worker, inside the step.
    assert any(op.kind == "receive" for op in t.ops if op.island == island)
    # Each receive sits right before the fragment that needs it
    # (activations for island 1's forwards, gradients for island 0's
    # backwards), never before other work (a pushed receive holds its op
    # loop).
    ops = sorted((op for op in t.ops if op.island == island),
                 key=lambda op: op.seq)
    receives = [k for k, op in enumerate(ops) if op.kind == "receive"]
    following = [next(o for o in ops[k:] if o.kind == "launch")
                 for k in receives]
    wanted = "_fwd_" if island == 1 else "_bwd_"
    assert all(wanted in o.name for o in following), [o.name
                                                       for o in following]
    # They are pulled: the op loop goes on, and the fragment is enqueued
    # before its data has arrived (worker/transfers.py).
    assert {ops[k].name for k in receives} == {"pull"}
  # Island 1 idles at least while island 0's last backward runs (it needs
  # island 1's last gradient). Island 0 runs the first and the last launch;
  # on a loaded machine its launches can overlap end to end (1.0).
  utilization = t.utilization()
  assert 0 < utilization[1] < 1 and 0 < utilization[0] <= 1, utilization


@pytest.mark.parametrize("schedule,stages", [("ZeroBubbleH1", 2),
                                             ("Circular", 4)])
def test_zero_bubble_and_interleaved_schedules(schedule, stages, mlp, rel_err,
                                               proxy_devices, cpu_devices):
  model = mlp(stages=stages, microbatches=M)
  step = mpmd.pipeline(model.train_step, mpmd.Topology.islands(),
                       stages={f"s{s}": s % 2 for s in range(stages)},
                       schedule=schedule, microbatches=M, batch_argnums=(1,))
  params, losses = _train(step, model, steps=2)
  ref_params, ref_losses = _reference(model, cpu_devices, steps=2)
  for got, want in zip(losses, ref_losses):
    assert abs(got - want) <= 1e-5 * abs(want)
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
    assert rel_err(got, want) <= 1e-5
  if schedule == "ZeroBubbleH1":  # backward split into activation/weight
    assert step.schedule.order("island1")[:5] == ["F0", "Ba0", "F1", "Ba1",
                                                  "Bw0"]
  else:  # two stages per island, interleaved
    assert step.schedule.order("island0")[:4] == ["F0@s0", "F1@s0", "F0@s2",
                                                  "F1@s2"]


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_own_splitter_trains_the_same_model(schedule, mlp, rel_err,
                                            proxy_devices, cpu_devices):
  model = mlp(stages=2, microbatches=M)
  step = mpmd.pipeline(model.train_step, mpmd.Topology.islands(),
                       stages={"s0": 0, "s1": 1}, schedule=schedule,
                       microbatches=M, batch_argnums=(1,),
                       partitioner="jax_pathways")
  params, losses = _train(step, model, steps=2)
  ref_params, ref_losses = _reference(model, cpu_devices, steps=2)
  assert step.partitioner == "jax_pathways"
  # The forward pass is the same math: the first loss is bit-exact.
  assert losses[0] == ref_losses[0]
  assert abs(losses[1] - ref_losses[1]) <= 1e-5 * abs(ref_losses[1])
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
    assert rel_err(got, want) <= 1e-5
  textbook = (mpmd.schedule.gpipe if schedule == "GPipe"
              else mpmd.schedule.one_f_one_b)(["island0", "island1"],
                                              ["s0", "s1"], M)
  assert step.schedule.meshes == textbook.meshes
  with pytest.raises(RuntimeError, match="runs the step fragment by "
                     "fragment, not as an IFRT IR program"):
    step.ifrt_ir


def test_bad_placements_fail_clearly(mlp, proxy_devices):
  model = mlp(stages=2, microbatches=M)
  islands = mpmd.Topology.islands()
  with pytest.raises(ValueError, match=r"stage 's1' is assigned to island 5, "
                     r"which does not exist .*islands \[0, 1\]"):
    mpmd.pipeline(model.train_step, islands, stages={"s0": 0, "s1": 5},
                  microbatches=M)
  with pytest.raises(ValueError, match="does not exist; the cluster has "
                     r"islands \[0, 1\]"):
    mpmd.Topology.islands([0, 2])
  with pytest.raises(ValueError, match="a mesh of 8 devices does not fit "
                     "island 0, which has 4 devices"):
    mpmd.Topology.islands(devices_per_mesh=8)
  overlapping = {"a": Mesh(np.array(proxy_devices[0:3]), ("d",)),
                 "b": Mesh(np.array(proxy_devices[2:4]), ("d",))}
  with pytest.raises(ValueError, match="meshes 'a' and 'b' overlap: both hold "
                     "device 2"):
    mpmd.Topology(overlapping)
  with pytest.raises(ValueError, match="unknown pipeline schedule 'Zigzag'"):
    mpmd.pipeline(model.train_step, islands, stages={"s0": 0, "s1": 1},
                  schedule="Zigzag", microbatches=M)
  step = mpmd.pipeline(model.train_step, islands, stages={"s0": 0},
                       microbatches=M, batch_argnums=(1,))
  with pytest.raises(ValueError, match=r"stages \['s1'\] have no mesh"):
    step(model.params, (model.x, model.y))
  step = mpmd.pipeline(model.train_step, islands, stages={"s0": 0, "s1": 1},
                       microbatches=3, batch_argnums=(1,))
  with pytest.raises(ValueError, match="cannot be split into 3 microbatches"):
    step(model.params, (model.x, model.y))


def test_donated_parameters_are_updated_in_place(mlp, proxy_devices,
                                                 cpu_devices):
  model = mlp(stages=2, microbatches=M)
  step = mpmd.pipeline(model.train_step, mpmd.Topology.islands(),
                       stages={"s0": 0, "s1": 1}, microbatches=M,
                       batch_argnums=(1,), donate_argnums=(0,))
  leaves, tree = jax.tree.flatten(model.params)
  shardings = step.lower(model.params, (model.x, model.y)).input_shardings
  params = jax.tree.unflatten(tree, [jax.device_put(leaf, s) for leaf, s in
                                     zip(leaves, shardings)])
  first, losses = params, []
  for _ in range(STEPS):
    params, loss = step(params, (model.x, model.y))
    losses.append(float(loss))
  _, ref_losses = _reference(model, cpu_devices)
  for got, want in zip(losses, ref_losses):
    assert abs(got - want) <= 1e-5 * abs(want)
  # The step consumed the parameters it was given, on the workers.
  with pytest.raises(Exception, match="deleted"):
    np.asarray(jax.tree.leaves(first)[0])


@pytest.mark.parametrize("donate", [False, True])
def test_steps_after_the_first_run_in_cpp_with_plain_jax_bits(
    mlp, pathways, proxy_devices, cpu_devices, donate):
  """After Python has run a pipeline step once, the steps alike are the
  sessions' C++ fast path's: it submits the same schedule of ops
  (controller/gangs.py: launches, moves between the islands with fresh
  transfer ids, deletes of the step's temporaries) with the next call's
  buffers. Every step's bits are jax.jit's."""
  model = mlp(stages=2, microbatches=M)
  step = mpmd.pipeline(model.train_step, mpmd.Topology.islands(),
                       stages={"s0": 0, "s1": 1}, schedule="1F1B",
                       microbatches=M, batch_argnums=(1,),
                       donate_argnums=(0,) if donate else ())
  leaves, tree = jax.tree.flatten(model.params)
  shardings = step.lower(model.params, (model.x, model.y)).input_shardings
  params = jax.tree.unflatten(tree, [jax.device_put(leaf, s) for leaf, s in
                                     zip(leaves, shardings)])
  mesh = Mesh(np.array(cpu_devices[:4]), ("data",))
  replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  batches = [(jax.device_put(a, split), jax.device_put(b, split))
             for a, b in zip(np.split(model.x, M), np.split(model.y, M))]
  local_step = jax.jit(model.train_step)
  local = jax.device_put(model.params, replicated)

  def executes() -> int:
    return admin.status(pathways.address,
                        pathways.token)["fast_path"]["executes"]

  before = executes()
  for _ in range(STEPS):  # (a read of the params would take them back to
    # Python, the donating launch with them: only the loss is read)
    params, loss = step(params, (model.x, model.y))
    local, local_loss = local_step(local, batches)
    np.testing.assert_array_equal(np.asarray(loss), np.asarray(local_loss))
  assert executes() - before >= STEPS - 1
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(local)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
