"""jax.export through the cluster: a program exported on a mesh of the
cluster's devices, serialized, deserialized and called (as a user ships a
model), computes what plain JAX does. Every export failed in the client
before the controller reported `serialize_with_sdy` (JAX's export_test:
144 of 151 tests)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

pytestmark = pytest.mark.integration


def test_an_exported_program_round_trips(run_both):
  def program(devices):
    mesh = Mesh(np.array(devices[:4]), ("d",))
    sharding = NamedSharding(mesh, P("d"))

    def f(x, w):
      return jnp.tanh(x @ w) * 2 + x.sum()

    x = jax.device_put(jnp.arange(32.0).reshape(8, 4) / 7, sharding)
    w = jax.device_put(jnp.ones((4, 4)) / 3, NamedSharding(mesh, P()))
    exported = jax.export.export(jax.jit(f))(x, w)
    assert exported.nr_devices == 4
    back = jax.export.deserialize(exported.serialize())
    y = back.call(x, w)
    assert y.sharding.device_set <= set(devices[:4])
    return y, jax.jit(f)(x, w)
  run_both(program)


def test_shape_polymorphic_export(run_both):
  def program(devices):
    with jax.default_device(devices[0]):
      (b,) = jax.export.symbolic_shape("b")
      spec = jax.ShapeDtypeStruct((b, 3), jnp.float32)
      exported = jax.export.export(jax.jit(lambda x: jnp.cumsum(x, 0)))(spec)
      back = jax.export.deserialize(exported.serialize())
      return [back.call(jnp.arange(3.0 * n).reshape(n, 3)) for n in (1, 5)]
  run_both(program)
