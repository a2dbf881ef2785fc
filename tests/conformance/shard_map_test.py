"""shard_map collectives inside one island."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

pytestmark = pytest.mark.integration


def _mesh(devices, island=0):
  return Mesh(np.array(devices[4 * island:4 * island + 4]), ("i",))


@pytest.mark.parametrize("island", [0, 1])
def test_psum_ppermute_all_gather(run_both, island):
  def program(devices):
    mesh = _mesh(devices, island)
    x = jax.device_put(jnp.arange(16.0).reshape(8, 2),
                       NamedSharding(mesh, P("i")))

    @jax.jit
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=P("i"),
                       out_specs=(P(), P("i"), P("i"), P()))
    def f(a):
      total = jax.lax.psum(a, "i")
      shifted = jax.lax.ppermute(a, "i", [(j, (j + 1) % 4) for j in range(4)])
      gathered = jax.lax.all_gather(a, "i", tiled=True)
      return total, shifted, gathered[None], jax.lax.pmax(a.max(), "i")

    return f(x)
  run_both(program)


def test_psum_scatter_and_axis_index(run_both):
  def program(devices):
    mesh = _mesh(devices)
    x = jax.device_put(jnp.arange(32.0).reshape(8, 4),
                       NamedSharding(mesh, P("i")))

    @jax.jit
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=P("i"),
                       out_specs=P("i"))
    def f(a):
      s = jax.lax.psum_scatter(a, "i", scatter_dimension=1, tiled=True)
      return s + jax.lax.axis_index("i")

    return f(x)
  run_both(program)
