"""Data-parallel training on both islands at once, then a model soup.

    python examples/data_parallel.py

Each island trains its own replica of a linear model data-parallel over its
four devices (a NamedSharding mesh per island); the controller interleaves
the two programs. Afterwards island 1's parameters are moved to island 0 --
worker to worker -- and averaged there.
"""
import jax_pathways

jax_pathways.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

islands = sorted({d.slice_index for d in jax.devices()})
meshes = {i: Mesh(np.array([d for d in jax.devices() if d.slice_index == i]),
                  ("data",)) for i in islands}

rng = np.random.default_rng(1)
x = rng.standard_normal((1024, 8)).astype(np.float32)
w_true = np.arange(1, 9, dtype=np.float32).reshape(8, 1)
y = x @ w_true + 0.1 * rng.standard_normal((1024, 1)).astype(np.float32)


def loss_fn(w, x, y):
  return jnp.mean((x @ w - y) ** 2)


@jax.jit
def step(w, x, y):
  loss, grad = jax.value_and_grad(loss_fn)(w, x, y)
  return w - 0.05 * grad, loss


state = {}
for i in islands:
  batch = NamedSharding(meshes[i], P("data"))
  w0 = jax.random.normal(jax.random.key(i), (8, 1))
  state[i] = [jax.device_put(w0, NamedSharding(meshes[i], P())),
              jax.device_put(x, batch), jax.device_put(y, batch)]

for it in range(100):
  for i in islands:  # one step on each island, interleaved
    w, xb, yb = state[i]
    state[i][0], loss = step(w, xb, yb)
  if it % 20 == 0:
    print(f"step {it:3d}  " + "  ".join(
        f"island {i} loss {float(loss_fn(*state[i])):.4f}" for i in islands))

home = NamedSharding(meshes[islands[0]], P())
soup = jnp.mean(jnp.stack([jax.device_put(state[i][0], home)
                           for i in islands]), axis=0)
print("averaged weights on island 0:", np.round(np.asarray(soup).ravel(), 2))
print("true weights:                ", w_true.ravel())
