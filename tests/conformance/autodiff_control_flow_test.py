"""grad, value_and_grad, scan, while_loop, fori_loop."""
import jax
import jax.numpy as jnp
import pytest

pytestmark = pytest.mark.integration


def test_grad_and_value_and_grad(run_both):
  def program(devices):
    def loss(w, x):
      return jnp.sum(jnp.tanh(x @ w) ** 2)
    w = jnp.linspace(-1, 1, 12).reshape(4, 3)
    x = jnp.linspace(0, 2, 8).reshape(2, 4)
    v, g = jax.jit(jax.value_and_grad(loss))(w, x)
    return v, g, jax.grad(loss, argnums=1)(w, x), jax.jacfwd(jnp.sin)(x[0])
  run_both(program)


def test_scan_while_fori(run_both):
  def program(devices):
    xs = jnp.arange(10.0)
    cumulative, ys = jax.lax.scan(lambda c, x: (c + x, c * x), 0.0, xs)
    steps = jax.jit(lambda n: jax.lax.while_loop(
        lambda s: s[0] < n, lambda s: (s[0] + 1, s[1] * 1.5), (0, 1.0)))(7)
    fori = jax.jit(lambda n: jax.lax.fori_loop(0, n, lambda i, c: c + i * i,
                                               0))(20)
    return cumulative, ys, steps, fori
  run_both(program)
