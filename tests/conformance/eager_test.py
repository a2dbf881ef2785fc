"""Eager jnp operations, bit-exact against plain JAX on the CPU."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytestmark = pytest.mark.integration


def test_elementwise_and_reductions(run_both):
  def program(devices):
    x = jnp.arange(24, dtype=jnp.float32).reshape(4, 6) / 7
    return {
        "sin": jnp.sin(x), "exp": jnp.exp(-x), "sum": x.sum(),
        "mean0": x.mean(0), "max1": x.max(1), "argmax": jnp.argmax(x, 1),
        "cumsum": jnp.cumsum(x, 1), "where": jnp.where(x > 1, x, -x),
    }
  run_both(program)


def test_linalg_and_indexing(run_both):
  def program(devices):
    a = jnp.arange(16, dtype=jnp.float32).reshape(4, 4) + jnp.eye(4) * 10
    b = jnp.linspace(0, 1, 4)
    return {
        "matmul": a @ a.T, "solve": jnp.linalg.solve(a, b),
        "slice": a[1:3, ::2], "gather": a[jnp.array([3, 0]), 1],
        "update": a.at[0, 1].set(-1.0), "concat": jnp.concatenate([a, a], 1),
        "sort": jnp.sort(-a, axis=1), "transpose": a.T.reshape(2, 8),
    }
  run_both(program)


def test_integer_and_bool_ops(run_both):
  def program(devices):
    i = jnp.arange(-5, 11, dtype=jnp.int32)
    return {"floordiv": i // 3, "mod": i % 4, "shift": i << 2,
            "cmp": i > 2, "any": jnp.any(i > 9), "clip": jnp.clip(i, -1, 3)}
  run_both(program)


def test_values_from_numpy_round_trip(proxy_devices):
  x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
  with jax.default_device(proxy_devices[2]):
    y = jnp.asarray(x)
    assert y.devices() == {proxy_devices[2]}
    np.testing.assert_array_equal(np.asarray(y), x)
