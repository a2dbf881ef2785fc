"""One client process of B10 (benchmarks/scale_benchmark.py).

Joins the controller at JAX_PATHWAYS_ADDRESS, compiles a small program for
each device of --targets (indices into jax.devices()), warms it up and
prints {"ready": true}. Then, per line on stdin:
  chain N   N calls without waiting, round robin over the targets, each on
            its own previous result; one wait at the end -> {"seconds": s}
  keep N    N more calls on the first target whose results are all kept
            alive -> {"live": arrays kept}
  drop      lets the kept arrays go -> {"live": 0}
"""
import argparse
import json
import sys
import time

import jax_pathways

parser = argparse.ArgumentParser()
parser.add_argument("--targets", required=True)
args = parser.parse_args()
jax_pathways.initialize()

import jax  # noqa: E402
import numpy as np  # noqa: E402

step = jax.jit(lambda x: x * 0.5 + 1.0)
devices = jax.devices()
xs = [jax.device_put(np.zeros((4,), np.float32), devices[int(i)])
      for i in args.targets.split(",")]
for _ in range(10):
  xs = [step(x) for x in xs]
jax.block_until_ready(xs)
kept: list = []
print(json.dumps({"ready": True, "devices": len(devices)}), flush=True)

for line in sys.stdin:
  verb, *rest = line.split()
  if verb == "chain":
    start = time.perf_counter()
    for i in range(int(rest[0])):
      k = i % len(xs)
      xs[k] = step(xs[k])
    jax.block_until_ready(xs)
    print(json.dumps({"seconds": time.perf_counter() - start}), flush=True)
  elif verb == "keep":
    kept += [step(xs[0]) for _ in range(int(rest[0]))]
    jax.block_until_ready(kept[-1])
    print(json.dumps({"live": len(kept)}), flush=True)
  elif verb == "drop":
    kept = []
    print(json.dumps({"live": 0}), flush=True)
