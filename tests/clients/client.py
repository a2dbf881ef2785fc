"""One client process of the many-clients tests, on a running controller
(JAX_PATHWAYS_ADDRESS, JAX_PATHWAYS_TOKEN).

argv[1]: JSON {"devices": 4 | [2, 2] | null, "island": int | null,
               "steps": int, "seed": int, "hold_mb": int, "forever": bool,
               "offset": float (a constant of its program: another value,
               another program to compile)}
Prints JSON lines: {"devices": [...]} once placed, {"holding": n} when its
arrays are up, {"step": i, "ok": bool} per checked step, {"done": true};
or {"error": "..."} if JAX refused to start.
"""
import json
import sys

import jax_pathways


def say(**kw):
  print(json.dumps(kw), flush=True)


plan = json.loads(sys.argv[1])
devices = plan.get("devices")
jax_pathways.initialize(devices=tuple(devices) if isinstance(devices, list)
                        else devices, island=plan.get("island"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

try:
  mine = jax.devices()
except Exception as e:  # pylint: disable=broad-except
  say(error=f"{type(e).__name__}: {e}")
  sys.exit(0)
say(devices=[d.id for d in mine], islands=[d.slice_index for d in mine],
    physical=[int(str(d).split("physical=")[1].rstrip(")")) for d in mine])

n = len(mine)
mesh = Mesh(np.array(mine), ("d",))
split = NamedSharding(mesh, P("d"))
rng = np.random.default_rng(plan.get("seed", 0))
held = [jax.device_put(np.full((plan.get("hold_mb", 0) << 18,), i, np.float32),
                       mine[i % n]) for i in range(4 if plan.get("hold_mb") else 0)]
say(holding=len(held))


offset = float(plan.get("offset", 0.0))


@jax.jit
def step(w, x):
  # A collective over the client's devices, and per-device math.
  return jnp.tanh(x @ w).sum(axis=1) + jax.lax.with_sharding_constraint(
      x.sum(), NamedSharding(mesh, P())) + offset


step_count = plan.get("steps", 10)
i = 0
while plan.get("forever") or i < step_count:
  w = rng.normal(size=(16, 16)).astype(np.float32)
  x = rng.normal(size=(8 * n, 16)).astype(np.float32)
  got = np.asarray(step(w, jax.device_put(x, split)))
  want = np.tanh(x @ w).sum(axis=1) + x.sum() + offset
  say(step=i, ok=bool(np.allclose(got, want, rtol=1e-4, atol=1e-4)))
  i += 1
say(done=True)
