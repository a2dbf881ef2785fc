"""B3: parallel vs sequential dispatch of an S-stage chain.

    python benchmarks/chain_benchmark.py [--stages 1 2 4 8 16] [--repeats 5]

A chain of S stages (`h = tanh(h @ w_k)`, h 32x32 float32 = 4 KB), stage k
on island k % 4 of a 4-island cluster (one device each), so consecutive
stages hand 4 KB to another island. One step = the whole chain, waited for.
Four ways to run a step, in the same run:

  mpmd        jax_pathways: the chain as one MPMD program (mpmd.pipeline):
              one call, the controller submits every stage and transfer at
              once and the workers run them as data arrives
  client      jax_pathways, driven call by call from the client: S jitted
              calls and the device_puts between them, issued without waiting
  sequential  the same, waiting for each stage before dispatching the next
              (what a host-driven pipeline without asynchronous dispatch does)
  jax         in-process jax.jit on 4 CPU devices, call by call (reference)

Prints one JSON line per S: microseconds per step and the ratio of each to
in-process JAX.
"""
from __future__ import annotations

import argparse

from harness import emit, interleaved, log, setup, timed  # pylint: disable=g-bad-import-order

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jax_pathways import mpmd  # noqa: E402

ISLANDS = 4
WIDTH = 32  # 32 x 32 float32 = 4 KB between stages


def layer(w, h):
  return jnp.tanh(h @ w)


def weights(s: int) -> list[np.ndarray]:
  rng = np.random.default_rng(s)
  return [(rng.normal(size=(WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
          for _ in range(s)]


def mpmd_chain(s: int, x: np.ndarray):
  stage_fns = [mpmd.stage(f"s{k}")(layer) for k in range(s)]

  def chain(ws, h):
    for fn, w in zip(stage_fns, ws):
      h = fn(w, h)
    return h

  step = mpmd.pipeline(chain, mpmd.Topology.islands(),
                       stages={f"s{k}": k % ISLANDS for k in range(s)},
                       schedule="GPipe", microbatches=1)
  ws = weights(s)
  step(ws, x).block_until_ready()  # compile
  # Arguments on their islands once, like parameters between training steps.
  *ws, x = [jax.device_put(a, sh)
            for a, sh in zip(ws + [x], step.input_shardings)]
  return lambda: step(ws, x).block_until_ready()


def called_chain(s: int, x: np.ndarray, devices, wait_each: bool):
  f = jax.jit(layer)
  ws = [jax.device_put(w, devices[k % ISLANDS])
        for k, w in enumerate(weights(s))]
  x = jax.device_put(x, devices[0])

  def step():
    h = x
    for k, w in enumerate(ws):
      if k:
        h = jax.device_put(h, devices[k % ISLANDS])
      h = f(w, h)
      if wait_each:
        h.block_until_ready()
    h.block_until_ready()

  step()
  return step


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--stages", type=int, nargs="+",
                      default=[1, 2, 4, 8, 16])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--steps", type=int, default=10,
                      help="steps per sample")
  args = parser.parse_args()
  pathways, cpu = setup(islands=ISLANDS, devices_per_island=1)
  x = np.random.default_rng(0).normal(size=(WIDTH, WIDTH)).astype(np.float32)
  for s in args.stages:
    runs = {"mpmd": mpmd_chain(s, x),
            "client": called_chain(s, x, pathways, wait_each=False),
            "sequential": called_chain(s, x, pathways, wait_each=True),
            "jax": called_chain(s, x, cpu, wait_each=False)}
    med = interleaved(
        {k: (lambda run=run: timed(lambda: [run() for _ in range(args.steps)])
             / args.steps) for k, run in runs.items()}, args.repeats)
    us = {k: v * 1e6 for k, v in med.items()}
    emit("B3 chain", f"S={s}", stages=s,
         **{f"{k}_us": round(v, 1) for k, v in us.items()},
         **{f"{k}_ratio": round(v / us["jax"], 2) for k, v in us.items()
            if k != "jax"},
         mpmd_vs_client=round(us["mpmd"] / us["client"], 2))
    log(f"S={s:2d}  mpmd {us['mpmd']:8.0f} us  client {us['client']:8.0f} us"
        f"  sequential {us['sequential']:8.0f} us  in-process "
        f"{us['jax']:6.0f} us")


if __name__ == "__main__":
  main()
