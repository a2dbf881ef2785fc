"""Run by four_islands_test.py in a process of its own: pipeline training
over an embedded cluster of 4 islands, against plain JAX on the local CPU.
Prints one JSON line per schedule."""
import json
import os
import sys

os.environ["JAX_PLATFORMS"] = "proxy,cpu"
sys.path.insert(0, os.path.dirname(__file__))

import jax_pathways  # noqa: E402

jax_pathways.initialize(islands=4, devices_per_island=1)

import jax  # noqa: E402

from jax_pathways import mpmd  # noqa: E402
import models  # noqa: E402

STEPS = 3
M = 8


def main() -> None:
  cpu = jax.devices("cpu")[0]
  for schedule in sys.argv[1:]:
    model = models.make_mlp(stages=4, microbatches=M)
    step = mpmd.pipeline(model.train_step, mpmd.Topology.islands(),
                         stages={f"s{s}": s for s in range(4)},
                         schedule=schedule, microbatches=M,
                         batch_argnums=(1,))
    params, ref = model.params, jax.device_put(model.params, cpu)
    x, y = jax.device_put(model.x, cpu), jax.device_put(model.y, cpu)
    losses, ref_losses = [], []
    for _ in range(STEPS):
      params, loss = step(params, (model.x, model.y))
      ref, ref_loss = model.reference_step(ref, x, y)
      losses.append(float(loss))
      ref_losses.append(float(ref_loss))
    print(json.dumps({
        "schedule": schedule, "partitioner": step.partitioner,
        "losses": losses, "reference": ref_losses,
        "param_error": max(models.relative_error(a, b) for a, b in
                           zip(jax.tree.leaves(params), jax.tree.leaves(ref))),
        "order": {m: step.schedule.order(m)
                  for m in step.schedule.meshes},
        "islands": sorted({d.slice_index for leaf in jax.tree.leaves(params)
                           for d in leaf.sharding.device_set}),
    }), flush=True)


if __name__ == "__main__":
  main()
