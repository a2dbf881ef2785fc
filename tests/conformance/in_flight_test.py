"""1,000 collective launches issued without blocking.

Plain in-process JAX hangs on this with XLA:CPU (its rendezvous gives up once
~64 collective launches are in flight); the dispatcher's in-flight window
makes it safe.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

pytestmark = pytest.mark.integration


def test_thousand_collective_launches(proxy_devices):
  mesh = Mesh(np.array(proxy_devices[:4]), ("i",))
  f = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "i") * 0.25 + 1.0,
                            mesh=mesh, in_specs=P("i"), out_specs=P("i")))
  x = jax.device_put(jnp.zeros((4, 2)), NamedSharding(mesh, P("i")))
  outs = []
  for _ in range(1000):
    x = f(x)
    outs.append(x)
  # Each step: x -> x + 1 on every shard; all 1000 results are kept alive.
  np.testing.assert_array_equal(np.asarray(x), np.full((4, 2), 1000.0))
  np.testing.assert_array_equal(np.asarray(outs[499]), np.full((4, 2), 500.0))
