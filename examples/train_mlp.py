"""Train a small MLP through jax_pathways' embedded local cluster.

    pip install '.[examples]' && python examples/train_mlp.py

Ordinary JAX plus two lines: initialize() starts a controller and one worker
process per island (2 islands x 4 emulated CPU devices), and from then on
every jit call runs on the island workers, gang-ordered by the controller.
The step prints its loss with jax.debug.print: the island's worker calls
back into this process, which prints.
"""
import jax_pathways

jax_pathways.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

print("Island layout (one worker process per island):")
for island in sorted({d.slice_index for d in jax.devices()}):
  devices = [d for d in jax.devices() if d.slice_index == island]
  print(f"  island {island}: devices {[d.id for d in devices]} on "
        f"{devices[0].worker}")

# Data-parallel over island 0's four devices.
mesh = Mesh(np.array([d for d in jax.devices() if d.slice_index == 0]),
            ("data",))
batch = NamedSharding(mesh, P("data"))
replicated = NamedSharding(mesh, P())

rng = np.random.default_rng(0)
x = rng.standard_normal((512, 20)).astype(np.float32)
true_w = rng.standard_normal((20, 1)).astype(np.float32)
y = (np.tanh(x @ true_w) > 0).astype(np.float32)


def init(key):
  k1, k2 = jax.random.split(key)
  return {"w1": jax.random.normal(k1, (20, 64)) * 0.2, "b1": jnp.zeros(64),
          "w2": jax.random.normal(k2, (64, 1)) * 0.2, "b2": jnp.zeros(1)}


def loss_fn(params, x, y):
  hidden = jax.nn.gelu(x @ params["w1"] + params["b1"])
  logits = hidden @ params["w2"] + params["b2"]
  return optax.sigmoid_binary_cross_entropy(logits, y).mean()


optimizer = optax.adamw(3e-3)


@jax.jit
def train_step(params, opt_state, x, y, step):
  loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
  # Printed by this process, from inside the step on the island: the
  # workers call back into the client (jax_pathways serves JAX's callbacks).
  jax.lax.cond(step % 25 == 0,
               lambda: jax.debug.print("step {step:3d}  loss {loss:.4f}",
                                       step=step, loss=loss),
               lambda: None)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


params = jax.device_put(init(jax.random.key(0)), replicated)
# On the mesh like what train_step returns (Adam's step count would start
# uncommitted), so that train_step compiles once.
opt_state = jax.device_put(optimizer.init(params), replicated)
xb, yb = jax.device_put(x, batch), jax.device_put(y, batch)

for step in range(201):
  params, opt_state, loss = train_step(params, opt_state, xb, yb, step)
jax.effects_barrier()  # every print is out


@jax.jit
def accuracy(params, x, y):
  hidden = jax.nn.gelu(x @ params["w1"] + params["b1"])
  return jnp.mean(((hidden @ params["w2"] + params["b2"]) > 0) == (y > 0.5))


print(f"final loss {float(loss):.4f}, accuracy "
      f"{float(accuracy(params, xb, yb)):.3f} (trained on island 0's "
      f"{mesh.devices.size} devices)")
