"""RemapArrays: arrays made of other arrays' shards, as JAX sends it for
device_put to another device order and pathwaysutils for split/concatenate
by mesh axis; bit-exact with plain CPU JAX."""
import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from pathwaysutils.experimental.concatenate_by_mesh_axis import (
    concatenate_by_mesh_axis)
from pathwaysutils.experimental.split_by_mesh_axis import split_by_mesh_axis

import jax_pathways

pytestmark = pytest.mark.integration


def _meshes(devices):
  """Both islands: the first axis crosses them; and the devices reversed."""
  mesh = Mesh(np.array(devices).reshape(2, 4), ("island", "d"))
  turned = Mesh(np.array(devices[::-1]).reshape(2, 4), ("island", "d"))
  return mesh, turned


def _data(shape, seed=0):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_device_put_to_another_device_order(run_both):
  def program(devices):
    mesh, turned = _meshes(devices)
    x = jax.device_put(_data((8, 8)), NamedSharding(mesh, P("d", "island")))
    y = jax.device_put(x, NamedSharding(turned, P("d", "island")))
    r = jax.device_put(x, NamedSharding(turned, P(None, "d")))
    assert y.sharding.mesh == turned and not x.is_deleted()
    # Fully replicated, and within one island.
    whole = jax.device_put(_data((3, 5), 5), NamedSharding(mesh, P()))
    whole = jax.device_put(whole, NamedSharding(turned, P()))
    four = Mesh(np.array(devices[4:]), ("d",))
    z = jax.device_put(_data((8,), 6), NamedSharding(four, P("d")))
    z = jax.device_put(z, NamedSharding(
        Mesh(np.array(devices[4:])[[2, 0, 3, 1]], ("d",)), P("d")))
    return x, y, r, jax.jit(lambda a, b: a * 2 + b)(y, r), whole, z * 3
  run_both(program)


def test_device_put_to_another_device_order_with_donation(run_both):
  def program(devices):
    mesh, turned = _meshes(devices)
    x = jax.device_put(_data((8, 4), 1), NamedSharding(mesh, P("island")))
    y = jax.device_put(x, NamedSharding(turned, P("island")), donate=True)
    with pytest.raises(RuntimeError, match="deleted"):
      np.asarray(x)
    return y, jax.jit(lambda a: a + 1)(y)
  run_both(program)


def test_split_and_concatenate_by_mesh_axis(run_both):
  """Split along the axis between islands (each part on one island) and
  along the other (parts spanning both), then put together again."""
  def program(devices):
    mesh, _ = _meshes(devices)
    x = jax.device_put(_data((8, 8), 2), NamedSharding(mesh, P("island", "d")))
    rep = jax.device_put(_data((4, 8), 3), NamedSharding(mesh, P(None, "d")))
    parts = split_by_mesh_axis([x, rep], "island")
    assert [p[0].sharding.mesh.devices.flat[0] for p in parts] == [
        devices[0], devices[4]]
    assert not x.is_deleted()
    seen = [[np.asarray(a) for a in p] for p in parts]
    steps = [jax.jit(lambda a, b: a.sum() + b.sum())(*p) for p in parts]
    # Donated inputs are checked in test_a_remap_moves_no_data: plain CPU
    # JAX (jaxlib 0.10.2) crashes on is_deleted() of an array a remap
    # donated.
    back = concatenate_by_mesh_axis(parts, "island")
    assert back[0].sharding == x.sharding
    columns = split_by_mesh_axis(x, "d", [1, 3], donate=True)
    assert [c.shape for c in columns] == [(8, 2), (8, 4), (8, 2)]
    seen.append([np.asarray(c) for c in columns])
    return (seen, steps, back, jax.jit(lambda a: a @ a.T)(back[0]),
            concatenate_by_mesh_axis([[c] for c in columns], "d"))
  run_both(program)


def test_a_remap_moves_no_data(proxy_devices):
  """The outputs are the inputs' shards: the workers run one COPY per
  island and remap, and send or compute nothing; donated inputs are
  gone."""
  mesh, _ = _meshes(proxy_devices)
  data = _data((8, 8), 4)
  x = jax.device_put(data, NamedSharding(mesh, P("island", "d")))
  x.block_until_ready()
  with jax_pathways.trace() as t:
    parts = split_by_mesh_axis(x, "island")
    back = concatenate_by_mesh_axis([[p] for p in parts], "island")[0]
    jax.block_until_ready(back)
  kinds = [op.kind for op in t.ops]
  assert kinds.count("copy") == 4, kinds
  assert not {"send", "receive", "launch"} & set(kinds), kinds
  assert all(p.is_deleted() for p in parts) and not x.is_deleted()
  np.testing.assert_array_equal(np.asarray(back), data)
  np.testing.assert_array_equal(np.asarray(x), data)
