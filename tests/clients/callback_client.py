"""A client process whose programs call back into it, on a running
controller (JAX_PATHWAYS_ADDRESS, JAX_PATHWAYS_TOKEN).

argv[1]: JSON {"mode": "steps" | "block", "secret": float, "steps": int,
               "devices": [global device ids]}
  steps: `steps` launches of a program on `devices` whose pure_callback
    adds this process's secret and whose debug callback counts; prints
    {"step": i, "ok": bool} per step and {"done": n_callbacks} at the end.
  block: one launch whose callback prints {"blocked": true} and then waits
    for ever (the test kills this process).
"""
import json
import sys
import threading

import jax_pathways


def say(**kw):
  print(json.dumps(kw), flush=True)


plan = json.loads(sys.argv[1])
jax_pathways.initialize()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

devices = [jax.devices()[i] for i in plan["devices"]]
mesh = Mesh(np.array(devices), ("d",))
secret = np.float32(plan.get("secret", 0))
seen = []


def add_secret(x):
  return (x + secret).astype(x.dtype)


def block(x):
  say(blocked=True)
  threading.Event().wait()
  return x


@jax.jit
def step(x):
  jax.debug.callback(lambda s: seen.append(float(s)), x.sum())
  y = jax.pure_callback(add_secret if plan["mode"] == "steps" else block,
                        jax.ShapeDtypeStruct(x.shape, x.dtype), x)
  return y * 2


for i in range(plan.get("steps", 1)):
  x = np.arange(8 * len(devices), dtype=np.float32) + i
  got = np.asarray(step(jax.device_put(x, NamedSharding(mesh, P("d")))))
  say(step=i, ok=bool(np.array_equal(got, (x + secret) * 2)))
jax.effects_barrier()
say(done=len(seen))
