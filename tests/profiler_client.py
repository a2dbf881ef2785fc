"""A pathwaysutils user's profile, for profiler_test.py: jax.profiler traces
a jitted function run on both islands of the cluster at JAX_PATHWAYS_ADDRESS.

argv[1]: the trace directory. Prints one JSON line: {"devices": [...]} (the
devices it ran on) or {"error": "..."}. A process of its own because
pathwaysutils.initialize() monkey-patches jax.profiler.
"""
import json
import os
import sys

import jax_pathways

jax_pathways.initialize(os.environ["JAX_PATHWAYS_ADDRESS"],
                        token=os.environ["JAX_PATHWAYS_TOKEN"])

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pathwaysutils  # noqa: E402
from pathwaysutils import profiling  # noqa: E402

pathwaysutils.initialize()
# pathwaysutils 0.1.13 takes gs:// paths only; the controller writes local
# ones (a gs:// path is refused, see docs/architecture.md).
profiling._validate_gcs_bucket = lambda log_dir: None  # pylint: disable=protected-access


def scaled_square(x):
  return x * x * 0.5


def main() -> None:
  f = jax.jit(scaled_square)
  devices = [jax.devices()[0], jax.devices()[-1]]  # one per island
  xs = [jax.device_put(jnp.ones((32, 32)), d) for d in devices]
  xs = [f(x) for x in xs]  # compiled before the trace
  jax.block_until_ready(xs)
  jax.profiler.start_trace(sys.argv[1])
  for _ in range(3):
    xs = [f(x) for x in xs]
  jax.block_until_ready(xs)
  jax.profiler.stop_trace()
  print(json.dumps({"devices": [d.slice_index for d in devices]}), flush=True)


try:
  main()
except Exception as e:  # pylint: disable=broad-except
  print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
