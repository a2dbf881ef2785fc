"""Custom kernels: a Pallas kernel runs on the workers, and the client sees
the workers' platform, which JAX lowers for (Pallas picks its lowering by
platform; on CPU, interpret mode)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.extend import backend as jax_backend
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jax_pathways.worker import island_client

pytestmark = pytest.mark.integration


def _kernel(x_ref, y_ref, o_ref):
  o_ref[...] = jnp.tanh(x_ref[...] @ y_ref[...]) + x_ref[...].sum()


def _tiled_matmul(x, y):
  """A 2x2 grid of 8x8 output tiles, each from a row and a column block."""
  return pl.pallas_call(
      _kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(2, 2),
      in_specs=[pl.BlockSpec((8, 16), lambda i, j: (i, 0)),
                pl.BlockSpec((16, 8), lambda i, j: (0, j))],
      out_specs=pl.BlockSpec((8, 8), lambda i, j: (i, j)),
      interpret=True)(x, y)


def _accumulate_kernel(x_ref, y_ref, o_ref):
  @pl.when(pl.program_id(2) == 0)
  def _():
    o_ref[...] = jnp.zeros_like(o_ref)
  o_ref[...] += jnp.dot(x_ref[...], y_ref[...],
                        preferred_element_type=jnp.float32)


def _blocked_matmul(x, y):
  """Pallas' canonical matmul: 8x8 output blocks summed over k blocks
  (grid axis 2), the order of the sums fixed by the grid."""
  m, k = x.shape
  n = y.shape[1]
  return pl.pallas_call(
      _accumulate_kernel, out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
      grid=(m // 8, n // 8, k // 8),
      in_specs=[pl.BlockSpec((8, 8), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((8, 8), lambda i, j, kk: (kk, j))],
      out_specs=pl.BlockSpec((8, 8), lambda i, j, kk: (i, j)),
      interpret=True)(x, y)


def test_devices_report_the_workers_platform(proxy_devices):
  worker = island_client.island_client("cpu", 1).local_devices()[0]
  assert {(d.platform, d.device_kind) for d in proxy_devices} == {
      (worker.platform, worker.device_kind)}
  # What jax.jit lowers for through jax_pathways.
  assert jax_backend.get_backend("proxy").platform == "cpu"


@pytest.mark.parametrize("device", [0, 5])
def test_pallas_kernel_is_bit_exact(run_both, device):
  def program(devices):
    x = jax.device_put(
        jnp.arange(256, dtype=jnp.float32).reshape(16, 16) / 97,
        devices[device])
    return jax.jit(_tiled_matmul)(x, jnp.sin(x).T)
  run_both(program)


def test_pallas_kernel_in_shard_map_is_bit_exact(run_both):
  def program(devices):
    mesh = Mesh(np.array(devices[4:8]), ("d",))
    x = jax.device_put(
        jnp.arange(1024, dtype=jnp.float32).reshape(64, 16) / 89,
        NamedSharding(mesh, P("d")))
    y = jax.device_put(jnp.cos(jnp.arange(256, dtype=jnp.float32)
                               ).reshape(16, 16), NamedSharding(mesh, P()))
    f = jax.jit(jax.shard_map(_tiled_matmul, mesh=mesh,
                              in_specs=(P("d"), P()), out_specs=P("d"),
                              check_vma=False))
    return f(x, y)
  run_both(program)


def test_pallas_blocked_matmul_is_bit_exact(run_both):
  def program(devices):
    x = jax.device_put(jnp.sin(jnp.arange(24 * 32, dtype=jnp.float32)
                               ).reshape(24, 32), devices[2])
    y = jax.device_put(jnp.cos(jnp.arange(32 * 16, dtype=jnp.bfloat16)
                               ).reshape(32, 16), devices[2])
    return jax.jit(_blocked_matmul)(x, y.astype(jnp.float32))
  run_both(program)
