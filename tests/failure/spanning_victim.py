"""A client running a program that spans both islands until a test kills or
stops island 1's worker.

Prints JSON lines: the cluster's pids, "ready", what the user saw, then
whether island 0 still computes (against plain JAX on this process's CPU
backend), for this client and for a new one, and what the controller's
status says of each island.
"""
import json
import os
import subprocess
import sys
import time

# Plain JAX's CPU backend next to the proxy one: the reference.
os.environ["JAX_PLATFORMS"] = "proxy,cpu"

import jax_pathways  # noqa: E402

# Island 1 stays lost (the test looks at the loss, not at a rejoin).
jax_pathways.initialize(restart_workers=False)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from jax_pathways import admin  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)


def say(**kw):
  print(json.dumps(kw), flush=True)


cluster = jax_pathways.local_cluster()
say(controller=cluster.controller.pid, workers=[w.pid for w in cluster.workers])
devices = jax.devices("proxy")
mesh = Mesh(np.array(devices), ("i",))
x = jax.device_put(np.ones((8, 64), np.float32), NamedSharding(mesh, P("i")))


def body(a):
  # Hundreds of all-reduces across the islands: a launch long enough to be
  # inside gloo when a worker dies.
  return jax.lax.fori_loop(
      0, 500, lambda _, a: a * 0.5 + jax.lax.psum(a, "i") / 16, a)


step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"),
                             out_specs=P("i")))
step(x).block_until_ready()
say(ready=True)

deadline = time.time() + 120
error = None
while time.time() < deadline:
  try:
    np.asarray(step(x))
  except Exception as e:  # pylint: disable=broad-except
    error = f"{type(e).__name__}: {e}"
    break
say(error=error, t=time.time())


# A program with collectives within one island; this client and a new one
# run it (the new one gets the 4 devices of the island that is left).
ISLAND0_STEP = """
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def island0_step(devs):
  m = Mesh(np.array(devs[:4]), ("j",))
  a = jax.device_put(np.arange(32.0, dtype=np.float32).reshape(4, 8),
                     NamedSharding(m, P("j")))
  f = jax.jit(jax.shard_map(lambda b: jax.numpy.sin(b) + jax.lax.psum(b, "j"),
                            mesh=m, in_specs=P("j"), out_specs=P("j")))
  return np.asarray(f(a))
"""
NEW_CLIENT = f"""
import sys
import jax_pathways
jax_pathways.initialize(sys.argv[1], devices=4)
{ISLAND0_STEP}
sys.stdout.write(island0_step(jax.devices()).tobytes().hex())
"""
exec(ISLAND0_STEP)  # pylint: disable=exec-used

expected = island0_step(jax.devices("cpu"))  # noqa: F821
t = time.time()
got = island0_step(devices)  # noqa: F821
say(island0_s=time.time() - t, island0_same=got.tobytes() == expected.tobytes())
env = dict(os.environ, JAX_PATHWAYS_TOKEN=cluster.token)
env.pop("JAX_PLATFORMS")
t = time.time()
new = subprocess.run([sys.executable, "-c", NEW_CLIENT, cluster.address],
                     env=env, capture_output=True, text=True, timeout=120,
                     check=False)
say(new_client_s=time.time() - t,
    new_client_same=new.stdout == expected.tobytes().hex(),
    new_client_stderr=new.stderr[-2000:] if new.returncode else "")
islands = admin.status(cluster.address, cluster.token)["islands"]
say(status=[{"island": i["island"], "alive": i["alive"], "error": i["error"]}
            for i in islands])
say(done=True)
