"""A client that keeps island 1 busy until a test kills a process under it.

Prints JSON lines: the cluster's pids, "ready", then what the user saw.
argv[1]: "worker" or "controller" (what the test will kill).
"""
import json
import sys
import time

import jax_pathways

jax_pathways.initialize()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402


def say(**kw):
  print(json.dumps(kw), flush=True)


cluster = jax_pathways.local_cluster()
say(controller=cluster.controller.pid, workers=[w.pid for w in cluster.workers],
    logs=cluster.log_dir)
devices = jax.devices()
mesh = Mesh(np.array(devices[4:]), ("i",))
x = jax.device_put(np.ones((8, 64), np.float32), NamedSharding(mesh, P("i")))
step = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "i") / 4, mesh=mesh,
                             in_specs=P("i"), out_specs=P("i")))
step(x).block_until_ready()
say(ready=True)

deadline = time.time() + 60
steps = 0
error = None
while time.time() < deadline:
  try:
    pending = [step(x) for _ in range(8)]  # launches in flight
    np.asarray(pending[-1])
    steps += 1
  except Exception as e:  # pylint: disable=broad-except
    error = f"{type(e).__name__}: {e}"
    break
say(error=error, t=time.time(), steps=steps)

t = time.time()
try:
  np.asarray(step(x))
  later = None
except Exception as e:  # pylint: disable=broad-except
  later = f"{type(e).__name__}: {e}"
say(later_error=later, later_s=time.time() - t)

if sys.argv[1] == "worker":
  # The other island keeps working.
  y = jax.jit(lambda a: a + 1)(jax.device_put(np.arange(4.0), devices[0]))
  say(island0=np.asarray(y).tolist())
else:
  # With the controller gone, an upload and a download raise too: jaxlib
  # once aborted the process here (issue 53 row 8).
  failed = []
  for put in (lambda: jax.device_put(np.arange(4.0), devices[0]),
              lambda: jax.device_put(np.ones((8, 64), np.float32),
                                     NamedSharding(mesh, P("i")))):
    try:
      np.asarray(put())
      failed.append(None)
    except Exception as e:  # pylint: disable=broad-except
      failed.append(f"{type(e).__name__}: {e}")
  say(put_errors=failed)
say(done=True)
