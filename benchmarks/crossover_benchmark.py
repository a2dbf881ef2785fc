"""B2: parity crossover -- how much compute a call needs for jax_pathways to
keep up with in-process JAX.

    python benchmarks/crossover_benchmark.py [--calls 64] [--repeats 3]
        [--platform cuda --devices 1 --sizes 256 1024 4096]

Each call is one batched matmul on the 4 devices of an island (x: [4, n, n]
sharded over the devices, y = x @ x / n, chained from x = 1/n: the values
fall to zero within a few calls, which does not change the time per call,
as XLA:CPU flushes denormals; checked 2026-11-27). Sizes sweep the compute
per call from ~10 us to ~10 ms. For each size, calls are issued without
waiting (in-process JAX in windows of 16) and the throughput of jax_pathways
is compared with in-process jax.jit on 4 CPU devices, in the same run.

Prints one JSON line per size and a summary: the smallest compute per call
from which jax_pathways keeps 95% of in-process throughput (at that size and
every larger one: one size above 95% between two below is noise on a shared
machine, not a crossover). Target (issue 2): <= 2 ms (Pathways: 2.3 ms on
128 TPUs).
"""
from __future__ import annotations

import argparse

from harness import (add_platform_args, emit, interleaved, log, setup,  # pylint: disable=g-bad-import-order
                     timed)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

SIZES = (8, 16, 32, 64, 96, 128, 192, 256, 320, 384, 512)
IN_PROCESS_WINDOW = 16
PARITY = 0.95


def make(devices, n):
  mesh = Mesh(np.array(devices), ("i",))
  step = jax.jit(lambda x: (x @ x) / n)
  # From the host: an array made on the default (proxy) device cannot be
  # copied to a GPU's.
  x = jax.device_put(np.full((len(devices), n, n), 1 / n, np.float32),
                     NamedSharding(mesh, P("i")))
  step(x).block_until_ready()
  return step, x


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--calls", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
  add_platform_args(parser)
  args = parser.parse_args()
  pathways_devices, local_devices = setup(devices_per_island=args.devices,
                                          platform=args.platform)
  crossover = None
  for n in sorted(args.sizes):  # the crossover reads them in order
    runs = {}
    for name, devices in (("pathways", pathways_devices),
                          ("jax", local_devices)):
      step, x = make(devices, n)
      window = args.calls if name == "pathways" else IN_PROCESS_WINDOW

      def run(step=step, x=x, window=window):
        y, held = x, []
        for _ in range(args.calls):
          y = step(y)
          held.append(y)
          if len(held) >= window:
            held.pop(0).block_until_ready()
        y.block_until_ready()

      runs[name] = lambda run=run: timed(run) / args.calls
    med = interleaved(runs, args.repeats)
    compute_us = med["jax"] * 1e6
    throughput = med["jax"] / med["pathways"]
    emit("B2 crossover", f"n={n}", compute_us=round(compute_us, 1),
         pathways_us=round(med["pathways"] * 1e6, 1),
         relative_throughput=round(throughput, 3))
    log(f"n={n:4d}  in-process {compute_us:9.1f} us/call   jax_pathways "
        f"{med['pathways'] * 1e6:9.1f} us/call   throughput "
        f"{throughput:6.1%}")
    if throughput < PARITY:
      crossover = None
    elif crossover is None:
      crossover = (n, compute_us)
  if crossover is None:
    emit("B2 crossover", "summary", crossover_us=None, target_us=2000,
         met=False)
    log(f"jax_pathways did not keep {PARITY:.0%} of in-process throughput "
        "up to the largest size")
  else:
    emit("B2 crossover", "summary", crossover_n=crossover[0],
         crossover_us=round(crossover[1], 1), target_us=2000,
         met=crossover[1] <= 2000)
    log(f"crossover: {crossover[1]:.0f} us of compute per call (n="
        f"{crossover[0]}); target <= 2000 us: "
        f"{'met' if crossover[1] <= 2000 else 'missed'}")


if __name__ == "__main__":
  main()
