"""Data-parallel steps across islands: sums in rank order vs gloo's ring.

    python benchmarks/reduction_order_benchmark.py [--repeats 5] [--steps 5]

One dense layer (parameters d x d, replicated) trained on a batch split over
the 8 devices of 2 islands (4 each), so every step all-reduces a d x d
gradient across islands. Each --reduction-order runs in a child process
with its own embedded cluster: 'rank' (the default: float sums add in the
order one host would, the same bits) and 'ring' (gloo's ring all-reduce).
Each child times the same step in-process on 8 CPU devices, interleaved,
for the ratio, and says whether its losses equal the in-process ones bit
for bit. One JSON line per case.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

WIDTHS = (256, 1024, 2048)


def child(order: str, repeats: int, steps: int) -> None:
  # pylint: disable=import-outside-toplevel
  from harness import emit, interleaved, setup, timed  # pylint: disable=g-bad-import-order
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  pathways, cpu = setup(islands=2, devices_per_island=4,
                        reduction_order=order)

  @jax.jit
  def step(w, x):
    loss, g = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    return w - 0.1 * g, loss

  for d in WIDTHS:
    rng = np.random.default_rng(d)
    w0 = rng.standard_normal((d, d)).astype(np.float32) / np.sqrt(d)
    x0 = rng.standard_normal((64, d)).astype(np.float32)

    def case(devices):
      mesh = Mesh(np.array(devices), ("data",))
      w = jax.device_put(w0, NamedSharding(mesh, P()))
      x = jax.device_put(x0, NamedSharding(mesh, P("data")))
      compile_s = timed(lambda: step(w, x)[1].block_until_ready())
      losses = []

      def run() -> float:
        def go():
          v = w
          for _ in range(steps):
            v, loss = step(v, x)
            losses.append(loss)
          v.block_until_ready()
        return timed(go) / steps
      return run, compile_s, losses

    run_p, compile_p, losses_p = case(pathways)
    run_c, compile_c, losses_c = case(cpu)
    t = interleaved({"pathways": run_p, "cpu": run_c}, repeats)
    same = all(np.asarray(a).tobytes() == np.asarray(b).tobytes()
               for a, b in zip(losses_p, losses_c))
    emit("reduction_order", f"{order} d={d}", reduction_order=order,
         gradient_mb=round(d * d * 4 / 2**20, 2),
         step_ms=round(t["pathways"] * 1e3, 3),
         in_process_step_ms=round(t["cpu"] * 1e3, 3),
         ratio=round(t["pathways"] / t["cpu"], 2),
         first_call_s=round(compile_p, 2),
         in_process_first_call_s=round(compile_c, 2),
         same_bits_as_in_process=same)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--child", choices=("rank", "ring"), default=None,
                      help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    child(args.child, args.repeats, args.steps)
    return
  for order in ("rank", "ring"):
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", order,
         "--repeats", str(args.repeats), "--steps", str(args.steps)],
        stdout=subprocess.PIPE, text=True, timeout=1200, check=True)
    for line in out.stdout.splitlines():
      if line.startswith("{"):
        print(json.dumps(json.loads(line)), flush=True)


if __name__ == "__main__":
  main()
