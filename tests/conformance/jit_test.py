"""jax.jit with NamedSharding on meshes inside one island."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("island", [0, 1])
def test_sharded_jit_on_each_island(run_both, island):
  def program(devices):
    mesh = Mesh(np.array(devices[4 * island:4 * island + 4]).reshape(2, 2),
                ("data", "model"))
    x = jax.device_put(jnp.arange(64, dtype=jnp.float32).reshape(8, 8),
                       NamedSharding(mesh, P("data", "model")))
    w = jax.device_put(jnp.ones((8, 4), jnp.float32) / 3,
                       NamedSharding(mesh, P("model", None)))

    @jax.jit
    def f(x, w):
      h = jnp.tanh(x @ w)
      return h, h.sum(0), jnp.mean(x, axis=1)

    h, s, m = f(x, w)
    assert h.sharding.mesh.devices.flat[0] == devices[4 * island]
    return h, s, m
  run_both(program)


def test_out_shardings_and_replication(run_both):
  def program(devices):
    mesh = Mesh(np.array(devices[:4]), ("d",))
    x = jnp.arange(32.0).reshape(8, 4)
    f = jax.jit(lambda a: (a * 2, a.sum()),
                out_shardings=(NamedSharding(mesh, P("d")),
                               NamedSharding(mesh, P())))
    y, s = f(jax.device_put(x, NamedSharding(mesh, P())))
    assert y.sharding.spec == P("d")
    return y, s, [np.asarray(sh.data) for sh in y.addressable_shards]
  run_both(program)


def test_recompile_and_cache_reuse(run_both):
  def program(devices):
    f = jax.jit(lambda a, n: a ** n, static_argnums=1)
    x = jax.device_put(jnp.arange(5.0), devices[1])
    return [f(x, n) for n in (1, 2, 3, 2, 1)]
  run_both(program)


def test_many_outputs_and_pytrees(run_both):
  def program(devices):
    @jax.jit
    def f(tree):
      return {k: (v * 2, v.astype(jnp.int32)) for k, v in tree.items()}
    tree = {str(i): jnp.full((i + 1,), i, jnp.float32) for i in range(6)}
    return f(tree)
  run_both(program)


def test_compiled_describes_itself(proxy_devices, cpu_devices):
  def f(a, b):
    return jnp.tanh(a @ b).sum()

  a, b = np.ones((16, 32), np.float32), np.ones((32, 8), np.float32)
  with jax.default_device(proxy_devices[0]):
    remote = jax.jit(f).lower(a, b).compile()
  with jax.default_device(cpu_devices[0]):
    local = jax.jit(f).lower(a, b).compile()
  assert remote.cost_analysis()["flops"] == local.cost_analysis()["flops"]
  assert remote.memory_analysis().output_size_in_bytes == 4
  assert "tanh" in remote.as_text()


@pytest.mark.parametrize("n_devices", [1, 4, 8])  # 8: spans both islands
def test_token_outputs_and_arguments(run_both, n_devices):
  """A program returning a token (create_token, after_all), on one device
  and over a mesh, and the token passed to another program."""
  def program(devices):
    mesh = Mesh(np.array(devices[:n_devices]), ("d",))
    x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("d")))
    y, token = jax.jit(lambda a: (a * 2 + 1, jax.lax.create_token()))(x)
    assert isinstance(token, jax._src.core.Token)  # pylint: disable=protected-access
    token.block_until_ready()
    z, token2 = jax.jit(lambda t, a: (a.sum(), jax.lax.after_all(t)))(token, y)
    assert isinstance(token2, jax._src.core.Token)  # pylint: disable=protected-access
    return y, z
  run_both(program)
