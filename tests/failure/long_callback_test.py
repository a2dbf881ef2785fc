"""A host callback takes as long as the user's function takes: XLA:CPU's
rendezvous, which aborted a worker once a device of a program waited 20 +
40 s for another stuck in a callback, is off on workers (issue 53 row 3).
The cluster's workers are started with an operator's XLA_FLAGS that would
abort after 1 + 2 s."""
from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

import cli_cluster
import processes

pytestmark = pytest.mark.integration

CLIENT = """
import time
import jax_pathways
jax_pathways.initialize()
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import io_callback
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

def slow(v):
  time.sleep(6)  # past the operator's 1 + 2 s
  return v + 1

mesh = Mesh(np.array(jax.devices()[:2]), ("d",))
x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("d")))
step = jax.jit(lambda v: (io_callback(slow, v, v) * 2).sum())
print("result", float(step(x)), flush=True)
"""


def test_a_callback_slower_than_xlas_rendezvous_abort_finishes():
  env = dict(os.environ, JAX_PATHWAYS_TOKEN=secrets.token_hex(16),
             XLA_FLAGS="--xla_cpu_collective_call_terminate_timeout_seconds=2 "
             "--xla_cpu_collective_call_warn_stuck_timeout_seconds=1")
  env.pop("JAX_PLATFORMS", None)
  procs: list[subprocess.Popen] = []
  try:
    ready = cli_cluster.start(env, 1, procs, "--devices", "2")
    client_env = dict(env, JAX_PATHWAYS_ADDRESS=ready["address"])
    client_env.pop("XLA_FLAGS")
    out = subprocess.run([sys.executable, "-c", CLIENT], env=client_env,
                         cwd="/", capture_output=True, text=True,
                         timeout=180, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "result 72.0" in out.stdout, out.stdout
    worker = procs[1]
    assert worker.poll() is None, cli_cluster.stderr_of(worker)[-3000:]
  finally:
    processes.stop(procs)
