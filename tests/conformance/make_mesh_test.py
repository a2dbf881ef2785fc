"""jax.make_mesh over both islands: JAX's mesh for one CPU host, the same
bits as plain JAX; tools that group devices by slice still see the
islands."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import mesh_utils
from jax.sharding import NamedSharding, PartitionSpec as P
from pathwaysutils.elastic import elastic

pytestmark = pytest.mark.integration


def test_make_mesh_over_all_devices_is_island_major(proxy_devices):
  mesh = jax.make_mesh((8,), ("x",))  # jax.devices(): the proxy's
  assert list(mesh.devices.flat) == proxy_devices
  assert mesh.axis_types == (jax.sharding.AxisType.Explicit,) * 1
  rows = jax.make_mesh((2, 4), ("i", "d"), devices=proxy_devices).devices
  assert [{d.slice_index for d in row} for row in rows] == [{0}, {1}]
  rows = jax.make_mesh((4, 2), ("a", "b"), devices=proxy_devices).devices
  assert [d.slice_index for d in rows[:, 0]] == [0, 0, 1, 1]


@pytest.mark.parametrize("shape", [(8,), (2, 4), (4, 2)])
def test_sharded_training_on_make_mesh(run_both, shape):
  """A data- (and model-) parallel step on jax.make_mesh's mesh: float
  all-reduces cross the islands."""
  names = ("data", "model")[:len(shape)]

  def program(devices):
    mesh = jax.make_mesh(shape, names, devices=devices)
    assert mesh.devices.shape == shape
    model = "model" if len(shape) == 2 else None
    rng = np.random.default_rng(5)
    values = rng.standard_normal((64, 16)).astype(np.float32)
    x = jax.device_put(values, NamedSharding(mesh, P("data")))
    w = jax.device_put(rng.standard_normal((16, 8)).astype(np.float32),
                       NamedSharding(mesh, P(None, model)))

    @jax.jit
    def step(w, x):
      loss, g = jax.value_and_grad(
          lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
      return w - 0.5 * g, loss

    losses = []
    for _ in range(3):
      w, loss = step(w, x)
      losses.append(loss)
    total = jax.jit(jax.shard_map(
        lambda v: jax.lax.psum(v.sum(0), names), mesh=mesh,
        in_specs=P(names), out_specs=P()))(
            jax.device_put(values, NamedSharding(mesh, P(names))))
    return losses, w, total
  run_both(program)


def test_make_mesh_within_one_island_and_its_errors(proxy_devices):
  mesh = jax.make_mesh((2, 2), ("a", "b"), devices=proxy_devices[4:])
  assert {d.slice_index for d in mesh.devices.flat} == {1}
  assert list(jax.make_mesh((4,), ("x",)).devices) == proxy_devices[:4]
  with pytest.raises(ValueError, match="must be >= the product"):
    jax.make_mesh((16,), ("x",))
  with pytest.raises(ValueError, match="sequence of ints"):
    jax.make_mesh(("a",), ("x",))


def test_slices_are_the_islands(proxy_devices):
  assert {d.slice_index for d in jax.devices()} == {0, 1}
  assert elastic.get_slice_to_devices(jax.devices()) == {
      0: proxy_devices[:4], 1: proxy_devices[4:]}
  hybrid = mesh_utils.create_hybrid_device_mesh((4,), (2,), proxy_devices)
  assert list(hybrid.flat) == proxy_devices
