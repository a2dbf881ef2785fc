"""A client of an embedded cluster whose island 1 worker a test kills.

argv[1]: "restart" or "no-restart" (initialize(restart_workers=...)).
Prints JSON lines; reads commands on stdin: "compute" runs a jit on island 1
(against plain JAX on this process's CPU backend), "status" reports the
controller's islands and the cluster's pids, "quit" ends.
"""
import json
import os
import sys

# Plain JAX's CPU backend next to the proxy one: the reference.
os.environ["JAX_PLATFORMS"] = "proxy,cpu"

import jax_pathways  # noqa: E402

jax_pathways.initialize(islands=2, devices_per_island=2,
                        restart_workers=sys.argv[1] == "restart")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jax_pathways import admin  # noqa: E402


def say(**kw):
  print(json.dumps(kw), flush=True)


cluster = jax_pathways.local_cluster()
f = jax.jit(lambda a: jnp.sin(a) * 2.5 + jnp.cumsum(a) / 3.0)
a = np.linspace(-3, 3, 64, dtype=np.float32)
expected = np.asarray(f(jax.device_put(a, jax.devices("cpu")[0]))).tobytes()
devices = jax.devices()
old = jax.device_put(a, devices[2])
f(old).block_until_ready()
say(controller=cluster.controller.pid, workers=[w.pid for w in cluster.workers],
    address=cluster.address, token=cluster.token)
for line in sys.stdin:
  cmd = line.strip()
  if cmd == "compute":
    try:
      got = np.asarray(f(jax.device_put(a, devices[2]))).tobytes()
      say(same=got == expected)
    except Exception as e:  # pylint: disable=broad-except
      say(error=f"{type(e).__name__}: {e}")
  elif cmd == "status":
    say(islands=admin.status(cluster.address, cluster.token)["islands"],
        workers=[w.pid for w in cluster.workers], pids=cluster.pids,
        restarts=cluster.restarts)
  elif cmd == "quit":
    break
say(done=True)
