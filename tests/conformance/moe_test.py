"""Mixture of experts over both islands (examples/moe.py): tokens cross
islands with all_to_all, trained the same through jax_pathways as on plain
JAX on one host."""
import importlib.util
import os

import jax
import numpy as np
import pytest

pytestmark = pytest.mark.integration

_spec = importlib.util.spec_from_file_location("moe_example", os.path.join(
    os.path.dirname(__file__), "..", "..", "examples", "moe.py"))
moe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(moe)


def _train(devices):
  dropped = []
  losses, params = moe.train(devices, on_step=lambda i, loss, d:
                             dropped.append(d))
  return jax.tree.map(np.asarray, (losses, params, dropped))


@pytest.fixture(scope="module")
def runs(proxy_devices, cpu_devices):
  """(plain JAX, jax_pathways): every loss, the final parameters, the
  dropped choices of every step."""
  assert {d.slice_index for d in proxy_devices} == {0, 1}
  with jax.default_device(cpu_devices[0]):
    expected = _train(cpu_devices)
  with jax.default_device(proxy_devices[0]):
    actual = _train(proxy_devices)
  return expected, actual


def test_moe_trains_across_islands(runs):
  (losses, params, dropped), actual = runs
  assert len(losses) == moe.STEPS and losses[-1] < 0.1 * losses[0]
  # Capacity was exceeded: the dropped-token path ran.
  assert all(0 < d < moe.TOKENS * moe.TOP_K for d in dropped)
  # Routing is integer work: the same tokens went to the same experts.
  np.testing.assert_array_equal(dropped, actual[2])
  np.testing.assert_allclose(losses, actual[0], rtol=1e-4)
  jax.tree.map(lambda e, a: np.testing.assert_allclose(e, a, rtol=1e-3,
                                                       atol=1e-5),
               params, actual[1])


def test_moe_bit_identical_to_plain_jax(runs):
  expected, actual = runs
  differ = [jax.tree_util.keystr(path) for (path, e), a in zip(
      jax.tree_util.tree_leaves_with_path(expected), jax.tree.leaves(actual))
            if e.tobytes() != a.tobytes()]
  assert not differ, f"not the same bits: {differ}"
