"""An MLP trained with optax for 100+ steps: every loss bit-identical."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

pytestmark = pytest.mark.integration

STEPS = 120


def _train(devices, island):
  mesh = Mesh(np.array(devices[4 * island:4 * island + 4]), ("data",))
  data = NamedSharding(mesh, P("data"))
  replicated = NamedSharding(mesh, P())
  rng = np.random.default_rng(0)
  x = rng.standard_normal((64, 16)).astype(np.float32)
  y = (np.sin(x.sum(1, keepdims=True)) > 0).astype(np.float32)

  def init(key):
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (16, 32)) * 0.3, "b1": jnp.zeros(32),
            "w2": jax.random.normal(k2, (32, 1)) * 0.3, "b2": jnp.zeros(1)}

  def loss_fn(params, x, y):
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    logits = h @ params["w2"] + params["b2"]
    return optax.sigmoid_binary_cross_entropy(logits, y).mean()

  optimizer = optax.adam(1e-2)

  @jax.jit
  def step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  params = jax.device_put(init(jax.random.key(0)), replicated)
  opt_state = optimizer.init(params)
  xb, yb = jax.device_put(x, data), jax.device_put(y, data)
  losses = []
  for _ in range(STEPS):
    params, opt_state, loss = step(params, opt_state, xb, yb)
    losses.append(loss)
  return losses, params


@pytest.mark.parametrize("island", [0, 1])
def test_mlp_with_optax(run_both, island):
  losses, _ = run_both(lambda devices: _train(devices, island))
  assert losses[-1] < 0.5 * losses[0]  # it did learn
