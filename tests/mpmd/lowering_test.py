"""The marked step in the MPMD dialect: stages as named computations (with
their transpose count), microbatches as counted calls."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_pathways import mpmd, shardy_mpmd
from jax_pathways.mpmd import lowering

pytestmark = pytest.mark.integration  # lowers with the cluster's backend


def _lowered(microbatches=3):
  @mpmd.stage("first")
  def first(w, x):
    return jnp.tanh(x @ w)

  @mpmd.stage("second")
  def second(w, h):
    return jnp.sum(h @ w)

  def loss(params, x):
    return second(params[1], first(params[0], x))

  def step(params, xs):
    return mpmd.value_and_grad(loss)(params, xs)

  params = (np.ones((3, 4), np.float32), np.ones((4, 2), np.float32))
  xs = [np.ones((2, 3), np.float32)] * microbatches
  module = jax.jit(step).lower(params, xs).compiler_ir("stablehlo")
  return lowering.to_mpmd(module, shardy_mpmd.load().clone_mlir_module)


def test_stages_become_named_computations(cpu_devices):
  lowered = _lowered()
  text = str(lowered.module)
  assert lowered.stage_names == ["first", "second"]
  assert lowered.microbatches == 3
  origins = re.findall(r'mpmd\.named_computation<"(\w+)"(\(1\))?>', text)
  # Every microbatch has a forward and a backward of each stage.
  assert sorted(origins) == sorted(
      [("first", ""), ("second", ""), ("first", "(1)"), ("second", "(1)")] * 3)
  assert "mpmdstage__" not in text  # the stage functions are inlined


def test_microbatches_become_counted_calls_in_order(cpu_devices):
  text = str(_lowered(microbatches=4).module)
  counters = [int(c) for c in re.findall(r"mpmd\.call @\S+ .*call_counter = "
                                         r"(\d+) : ui32", text)]
  # Forwards first, in microbatch order; then JAX's backward order 0..3.
  assert counters == [0, 1, 2, 3, 0, 1, 2, 3]


def test_gradient_sums_run_in_the_backwards(cpu_devices):
  """Microbatch i's backward adds its weight gradients to the running sum
  it is given (each stage's backward then holds one copy, not M - 1); no
  gradient add is left between the calls in @main."""
  text = str(_lowered(microbatches=4).module)
  main = text[text.index("func.func public @main"):]
  main = main[:main.index("\n  }")]
  calls = re.findall(r"(%\d+):\d+ = mpmd\.call @(\S+)\((.*?)\) "
                     r"\{call_counter = (\d+)", main)
  backwards = [c for c in calls if re.search(r"___\d+$", c[1])]
  assert [int(c[3]) for c in backwards] == [0, 1, 2, 3]
  for (made, *_), (_, _, operands, _) in zip(backwards, backwards[1:]):
    # The two stages' weight gradients of the backward before.
    assert f"{made}#0" in operands and f"{made}#1" in operands
  added = re.findall(r"stablehlo\.add (%\d+)#\d+, (%\d+)#\d+", main)
  assert not [a for a in added if a[0] in {c[0] for c in backwards}]


def test_the_stage_marker_is_plain_jax(cpu_devices):
  @mpmd.stage("only")
  def f(w, x):
    return jnp.sin(x) * w

  def plain(w, x):
    return jnp.sin(x) * w

  w, x = np.float32(2.0), np.arange(4, dtype=np.float32)
  with jax.default_device(cpu_devices[0]):
    np.testing.assert_array_equal(f(w, x), jax.jit(plain)(w, x))
    grad = jax.grad(lambda w, x: jnp.sum(f(w, x)), argnums=(0, 1))
    plain_grad = jax.grad(lambda w, x: jnp.sum(plain(w, x)), argnums=(0, 1))
    for got, want in zip(grad(w, x), jax.jit(plain_grad)(w, x)):
      np.testing.assert_array_equal(got, want)
  with pytest.raises(ValueError, match="must be an identifier without"):
    mpmd.stage("bad__name")
