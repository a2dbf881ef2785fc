"""One client process of B6 (benchmarks/share_benchmark.py).

Joins the controller at JAX_PATHWAYS_ADDRESS with --weight, compiles one
program per --sizes (tanh(x @ x) on n x n, on device 0, which every client
shares) and prints {"ready": true}. For each line "SIZE SECONDS INFLIGHT" on
stdin it keeps INFLIGHT calls in flight for SECONDS and prints
{"done": [completion times]}.
"""
import argparse
import collections
import json
import sys
import time

import jax_pathways

parser = argparse.ArgumentParser()
parser.add_argument("--weight", type=float, default=1.0)
parser.add_argument("--sizes", type=str, required=True)
args = parser.parse_args()
jax_pathways.initialize(weight=args.weight)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

step = jax.jit(lambda x: jnp.tanh(x @ x))
inputs = {}
for n in (int(s) for s in args.sizes.split(",")):
  inputs[n] = jax.device_put(
      np.random.default_rng(n).normal(size=(n, n)).astype(np.float32) / n,
      jax.devices()[0])
  step(inputs[n]).block_until_ready()
print(json.dumps({"ready": True}), flush=True)

for line in sys.stdin:
  size, seconds, in_flight = line.split()
  x, end = inputs[int(size)], time.time() + float(seconds)
  pending: collections.deque = collections.deque()
  done = []
  while time.time() < end:
    while len(pending) < int(in_flight):
      pending.append(step(x))
    pending.popleft().block_until_ready()
    done.append(time.time())
  for p in pending:
    p.block_until_ready()
  print(json.dumps({"done": done}), flush=True)
