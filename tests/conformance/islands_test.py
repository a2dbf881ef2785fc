"""Two islands in one program: placement, moves between them, clear errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

pytestmark = pytest.mark.integration


def test_devices_name_their_island(proxy_devices):
  assert [d.slice_index for d in proxy_devices] == [0] * 4 + [1] * 4
  assert [d.island for d in proxy_devices] == [0] * 4 + [1] * 4
  assert [d.island_local_index for d in proxy_devices] == [0, 1, 2, 3] * 2
  assert "island 1" in proxy_devices[5].worker
  assert proxy_devices[0].platform == "cpu"
  assert jax.device_count() == 8 and jax.process_count() == 1


def test_programs_on_both_islands_interleaved(run_both):
  def program(devices):
    meshes = [Mesh(np.array(devices[4 * i:4 * i + 4]), ("i",)) for i in (0, 1)]
    shard = [NamedSharding(m, P("i")) for m in meshes]
    f = jax.jit(lambda a: jnp.cumsum(a * 1.5, axis=0))
    g = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "i"), mesh=meshes[1],
                              in_specs=P("i"), out_specs=P("i")))
    a = jax.device_put(jnp.arange(32.0).reshape(8, 4), shard[0])
    b = jax.device_put(jnp.arange(32.0).reshape(8, 4) * -1, shard[1])
    outs = []
    for step in range(5):
      a = f(a)                      # island 0
      b = g(b) / 4 + step           # island 1
      b = jax.device_put(b, shard[1])
      outs.append((a.sum(), b))
    return outs
  run_both(program)


def test_device_put_across_islands_and_back(run_both):
  def program(devices):
    x = jax.random.normal(jax.random.key(3), (16, 8))
    m0 = Mesh(np.array(devices[:4]), ("i",))
    m1 = Mesh(np.array(devices[4:]), ("i",))
    a = jax.device_put(x, NamedSharding(m0, P("i")))
    b = jax.device_put(a, NamedSharding(m1, P(None, "i")))  # move + reshard
    c = jax.jit(lambda v: v @ v.T)(b)                        # runs on island 1
    d = jax.device_put(c, devices[2])                         # back to island 0
    e = jax.device_put(jax.device_put(d, devices[7]), devices[0])
    assert b.sharding.mesh.devices.flat[0] == devices[4]
    assert d.devices() == {devices[2]}
    return b, c, d, e
  run_both(program)


def test_mesh_spanning_islands_fails_clearly(proxy_devices):
  mesh = Mesh(np.array(proxy_devices), ("i",))
  f = jax.jit(lambda a: a * 2, out_shardings=NamedSharding(mesh, P("i")))
  with pytest.raises(Exception, match=r"spans islands \[0, 1\]"):
    jax.block_until_ready(f(np.arange(16.0)))
  # The controller keeps serving after refusing the program.
  y = jax.jit(lambda a: a + 1)(jax.device_put(np.arange(3.0), proxy_devices[6]))
  np.testing.assert_array_equal(np.asarray(y), [1.0, 2.0, 3.0])
