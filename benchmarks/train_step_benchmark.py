"""A data-parallel training loop: every step puts a new batch sharded over
the island's 4 devices (one upload per shard) and runs a jitted step
returning (params, loss); the loss is read every 20 steps.

    python benchmarks/train_step_benchmark.py [--steps 400] [--repeats 3]

Prints the time per step through jax_pathways against the same loop on 4
in-process CPU devices (interleaved medians), then, over one more run of
`--steps` steps, each process's CPU per step by thread and the requests
the controller's C++ fast path took (`jax-pathways status`, fast_path):
what is left to Python shows there.
"""
from __future__ import annotations

import argparse
from typing import Any, Callable

from harness import (cpu_per_call, emit, interleaved,  # pylint: disable=g-bad-import-order
                     one_island_processes, timed)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402
import jax_pathways  # noqa: E402
from jax_pathways import admin  # noqa: E402
import numpy as np  # noqa: E402

LOG_EVERY = 20


def _loss(w: jax.Array, x: jax.Array) -> jax.Array:
  return jnp.mean((x @ w) ** 2)


@jax.jit
def _step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
  loss, grad = jax.value_and_grad(_loss)(w, x)
  return w - 0.01 * grad, loss


def _loop(devices: list[Any]) -> Callable[[int], None]:
  """`steps(n)` runs n steps on `devices`, warmed up (compiled, and the
  batch's upload kind seen once)."""
  mesh = Mesh(np.array(devices[:4]), ("d",))
  batch = NamedSharding(mesh, PartitionSpec("d"))
  state = {"w": jax.device_put(np.ones((64, 8), np.float32),
                               NamedSharding(mesh, PartitionSpec()))}
  rng = np.random.default_rng(0)

  def steps(n: int) -> None:
    w = state["w"]
    for i in range(n):
      x = jax.device_put(rng.random((32, 64), dtype=np.float32), batch)
      w, loss = _step(w, x)
      if i % LOG_EVERY == 0:
        float(loss)
    np.asarray(w)
    state["w"] = w

  steps(LOG_EVERY)
  return steps


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=400)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  pathways, cpu, pids = one_island_processes()
  loops = {"pathways": _loop(pathways), "jax": _loop(cpu)}
  med = interleaved({name: (lambda run=run: timed(
      lambda: run(args.steps)) / args.steps) for name, run in loops.items()},
                    args.repeats)
  cluster = jax_pathways.local_cluster()

  def fast_path() -> dict[str, int]:
    return admin.status(cluster.address, cluster.token)["fast_path"]

  before = fast_path()
  threads = cpu_per_call(pids, lambda: loops["pathways"](args.steps),
                         args.steps)
  after = fast_path()
  emit("train_step", "dp4", steps=args.steps,
       pathways_us=round(med["pathways"] * 1e6, 1),
       jax_us=round(med["jax"] * 1e6, 1), baseline="jax",
       ratio=round(med["pathways"] / med["jax"], 2),
       cpu_us_per_step=threads,
       fast_path={k: after[k] - before[k] for k in after})


if __name__ == "__main__":
  main()
