"""Two training scripts sharing one local cluster.

    python examples/two_clients.py

Starts a cluster (a controller and 2 island workers of 4 CPU devices), then
two independent client processes. Each is an ordinary training script that
asks for a virtual slice of 4 devices:

    jax_pathways.initialize("grpc://...", devices=4)

and sees devices 0..3; the controller places the two slices on the devices
the fewest clients hold (here: one island each), keeps their handles apart
and orders their launches on every device they share. While they train,
this process prints what `jax-pathways status` shows.
"""
import json
import os
import subprocess
import sys
import time

from jax_pathways import admin, config
from jax_pathways.cluster.local_cluster import LocalCluster

STEPS = 150


def client(name: str, seed: int) -> None:
  """One training script: data-parallel over its own 4 devices."""
  import jax_pathways
  jax_pathways.initialize(devices=4)  # address and token from the env

  import jax
  import numpy as np
  import optax
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  devices = jax.devices()
  print(f"[{name}] my devices: "
        + ", ".join(f"{d.id} (island {d.slice_index}, physical "
                    f"{d.physical_device})" for d in devices), flush=True)
  mesh = Mesh(np.array(devices), ("data",))
  batch, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())

  rng = np.random.default_rng(seed)
  x = rng.standard_normal((256, 16)).astype(np.float32)
  y = (x @ rng.standard_normal((16, 1)) > 0).astype(np.float32)
  params = {"w1": rng.standard_normal((16, 32)).astype(np.float32) * 0.3,
            "w2": rng.standard_normal((32, 1)).astype(np.float32) * 0.3}
  optimizer = optax.adam(1e-2)

  def loss_fn(p, x, y):
    logits = jax.nn.relu(x @ p["w1"]) @ p["w2"]
    return optax.sigmoid_binary_cross_entropy(logits, y).mean()

  @jax.jit
  def step(p, state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
    updates, state = optimizer.update(grads, state, p)
    return optax.apply_updates(p, updates), state, loss

  params = jax.device_put(params, replicated)
  state = optimizer.init(params)
  xb, yb = jax.device_put(x, batch), jax.device_put(y, batch)
  for i in range(STEPS):
    params, state, loss = step(params, state, xb, yb)
    if i % 30 == 0 or i == STEPS - 1:
      print(f"[{name}] step {i:3d}  loss {float(loss):.4f}", flush=True)


def main() -> None:
  cluster = LocalCluster(islands=2, devices_per_island=4, max_in_flight=16)
  cluster.start()
  try:
    env = dict(os.environ, **{config.ADDRESS: cluster.address,
                              config.TOKEN: cluster.token})
    env.pop("JAX_PLATFORMS", None)
    clients = [subprocess.Popen([sys.executable, __file__, "--client", name,
                                 str(seed)], env=env)
               for seed, name in enumerate(["alice", "bob"])]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until both are placed
      placed = [c for c in admin.status(cluster.address, cluster.token)
                ["clients"] if c["devices"] is not None]
      if len(placed) == 2 or any(c.poll() is not None for c in clients):
        break
      time.sleep(0.2)
    print("jax-pathways status while both train:")
    for c in placed:
      print("  " + json.dumps({k: c[k] for k in ("client", "asked",
                                                  "devices", "arrays")}))
    codes = [c.wait(timeout=300) for c in clients]
    print(f"both done (exit codes {codes})")
    if any(codes):
      sys.exit(1)
  finally:
    cluster.stop()


if __name__ == "__main__":
  if len(sys.argv) == 4 and sys.argv[1] == "--client":
    client(sys.argv[2], int(sys.argv[3]))
  else:
    main()
