"""Pipeline-parallel training over 4 islands with a 1F1B schedule.

    pip install '.[examples]' && python examples/pipeline.py [trace.json]

(Without an argument the trace goes into a new temporary folder, printed.)

An MLP of 8 layers is cut into 4 stages, one per island; every training step
splits the batch into 8 microbatches, which flow through the islands in the
1F1B order (each island alternates a forward and a backward once the pipe
is full). The whole step, optimizer update included, is one MPMD program:
one call from this process, the islands pass activations and gradients
worker to worker. The last step is traced: the trace file opens in
https://ui.perfetto.dev, and a picture of it is written next to it (.svg).
"""
import os
import sys
import tempfile

import jax_pathways

# Each island's device computes on a core of its own (shared round robin
# when the machine has fewer cores than islands), as it would on a host of
# its own; everything else runs on any core.
jax_pathways.initialize(islands=4, devices_per_island=1, pin_islands=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from jax_pathways import mpmd  # noqa: E402

TRACE = (sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    tempfile.mkdtemp(prefix="jax_pathways_pipeline_"), "pipeline_trace.json"))
STAGES, LAYERS_PER_STAGE, WIDTH, MICROBATCHES = 4, 2, 64, 8


def make_stage(s: int):
  @mpmd.stage(f"stage{s}")
  def stage(params, h):
    for w, b in params:
      h = jax.nn.gelu(h @ w + b)
    return h
  return stage


stages = [make_stage(s) for s in range(STAGES)]


def microbatch_loss(params, batch):
  x, y = batch
  h = x
  for stage, p in zip(stages, params["stages"]):
    h = stage(p, h)
  logits = h @ params["head"]
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


optimizer = optax.adam(3e-3)


def train_step(params, opt_state, batch):
  loss, grads = mpmd.value_and_grad(microbatch_loss)(params, batch)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


def init(key):
  keys = iter(jax.random.split(key, STAGES * LAYERS_PER_STAGE + 1))
  layer = lambda: (jax.random.normal(next(keys), (WIDTH, WIDTH)) / 8.0,  # noqa: E731
                   jnp.zeros(WIDTH))
  return {"stages": [[layer() for _ in range(LAYERS_PER_STAGE)]
                     for _ in range(STAGES)],
          "head": jax.random.normal(next(keys), (WIDTH, 10)) / 8.0}


# A classification task the network can learn: the label is the index of
# the largest of the first 10 features.
rng = np.random.default_rng(0)
x = rng.standard_normal((MICROBATCHES * 32, WIDTH)).astype(np.float32)
y = np.argmax(x[:, :10], axis=1).astype(np.int32)

topology = mpmd.Topology.islands()
print("Meshes:", topology)
step = mpmd.pipeline(train_step, topology,
                     stages={f"stage{s}": s for s in range(STAGES)},
                     schedule="1F1B", microbatches=MICROBATCHES,
                     batch_argnums=(2,), donate_argnums=(0, 1))

params = init(jax.random.key(0))
opt_state = optimizer.init(params)
for i in range(60):
  params, opt_state, loss = step(params, opt_state, (x, y))
  if i % 10 == 0:
    print(f"step {i:3d}  loss {float(loss):.4f}")

print(f"partitioned by: {step.partitioner}")
print(step.schedule)
with jax_pathways.trace(TRACE) as trace:
  params, opt_state, loss = step(params, opt_state, (x, y))
  loss.block_until_ready()
trace.save(TRACE.rsplit(".", 1)[0] + ".svg")
print(f"final loss {float(loss):.4f}")
busy = {i: round(u, 2) for i, u in trace.utilization().items()}
print(f"trace of the last step written to {TRACE} (and .svg); time in "
      "launches per "
      f"island: {busy}")
