"""Mixture of experts over both islands (examples/moe.py): tokens cross
islands with all_to_all, trained the same through jax_pathways as on plain
JAX on one host, by the example's own main() (the suite's one MoE
training on the cluster; examples_test.py does not run it again)."""
import importlib.util
import os
import re

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
def runs(proxy_devices, cpu_devices, capsys_module):
  """(plain JAX, jax_pathways): every loss, the final parameters, the
  dropped choices of every step. The jax_pathways run is the example's
  own main() (this process is initialized already: its initialize() is a
  no-op), so what a user sees is checked on the one training."""
  assert {d.slice_index for d in proxy_devices} == {0, 1}
  with jax.default_device(cpu_devices[0]):
    expected = _train(cpu_devices)
  seen = {}
  real_train = moe.train

  def recording_train(devices, steps=moe.STEPS, on_step=None):
    def both(i, loss, dropped):
      seen.setdefault("dropped", []).append(dropped)
      on_step(i, loss, dropped)
    seen["result"] = real_train(devices, steps, on_step=both)
    return seen["result"]

  moe.train = recording_train
  try:
    with jax.default_device(proxy_devices[0]):
      moe.main()
  finally:
    moe.train = real_train
  losses, params = seen["result"]
  actual = jax.tree.map(np.asarray, (losses, params, seen["dropped"]))
  return expected, actual, capsys_module.read()


@pytest.fixture(scope="module")
def capsys_module():
  """What the module's fixtures printed (pytest's capsys is per test)."""
  import contextlib  # pylint: disable=import-outside-toplevel
  import io  # pylint: disable=import-outside-toplevel
  out = io.StringIO()

  class Reader:
    @staticmethod
    def read() -> str:
      return out.getvalue()

  with contextlib.redirect_stdout(out):
    yield Reader


def test_the_example_prints_what_it_trained(runs):
  _, (losses, _, dropped), printed = runs
  assert "device 7 (island 1)" in printed, printed
  shown = [float(v) for v in re.findall(r"loss (\d+\.\d+)  dropped", printed)]
  assert shown == [round(float(losses[i]), 4) for i in range(moe.STEPS)
                   if i % 5 == 0 or i == moe.STEPS - 1], printed
  counts = [int(v) for v in re.findall(r"dropped (\d+)/1024", printed)]
  assert counts[0] == int(dropped[0])


def test_moe_trains_across_islands(runs):
  (losses, params, dropped), actual, _ = runs
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
  expected, actual, _ = runs
  differ = [jax.tree_util.keystr(path) for (path, e), a in zip(
      jax.tree_util.tree_leaves_with_path(expected), jax.tree.leaves(actual))
            if e.tobytes() != a.tobytes()]
  assert not differ, f"not the same bits: {differ}"
