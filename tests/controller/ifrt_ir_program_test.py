"""IFRT IR (MPMD) programs made with jaxlib's Shardy partitioner directly,
without jax_pathways.mpmd: the controller compiles and runs them, and the
MPMD executable answers what the client asks about it."""
import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from jax_pathways import shardy_mpmd

pytestmark = pytest.mark.integration

# Two named computations by hand, in the MPMD dialect.
PROGRAM = """
module @handmade {
  func.func public @main(%x: tensor<8x4xf32>, %w0: tensor<4x4xf32>,
                         %w1: tensor<4x2xf32>) -> tensor<8x2xf32> {
    %h = mpmd.named_computation<"a"> (%x, %w0) (%a0: tensor<8x4xf32>,
                                                 %a1: tensor<4x4xf32>) {
      %0 = stablehlo.dot_general %a0, %a1, contracting_dims = [1] x [0]
          : (tensor<8x4xf32>, tensor<4x4xf32>) -> tensor<8x4xf32>
      %1 = stablehlo.tanh %0 : tensor<8x4xf32>
      mpmd.return %1 : tensor<8x4xf32>
    } : (tensor<8x4xf32>, tensor<4x4xf32>) -> tensor<8x4xf32>
    %y = mpmd.named_computation<"b"> (%h, %w1) (%b0: tensor<8x4xf32>,
                                                 %b1: tensor<4x2xf32>) {
      %0 = stablehlo.dot_general %b0, %b1, contracting_dims = [1] x [0]
          : (tensor<8x4xf32>, tensor<4x2xf32>) -> tensor<8x2xf32>
      %1 = stablehlo.add %0, %0 : tensor<8x2xf32>
      mpmd.return %1 : tensor<8x2xf32>
    } : (tensor<8x4xf32>, tensor<4x2xf32>) -> tensor<8x2xf32>
    return %y : tensor<8x2xf32>
  }
}
"""


def _compiled(proxy_devices, program: str = PROGRAM):
  from jax._src.interpreters import mlir  # pylint: disable=import-outside-toplevel
  from jaxlib.mlir import ir  # pylint: disable=import-outside-toplevel
  extension = shardy_mpmd.load()
  meshes = {"first": proxy_devices[0:2], "second": proxy_devices[4:6]}
  with mlir.make_ir_context() as ctx, ir.Location.unknown(ctx):
    module = ir.Module.parse(program)
    phase = extension.PartitioningPhase
    result = extension.apply_mpmd_partitioning(
        module, func_name="main",
        named_meshes=[(n, [("x", 2)]) for n in meshes],
        assignment={"a": "first", "b": "second"}, input_meshes=[],
        output_meshes=[], donate_argnums=[], partitioning_options={},
        fragment_merge_rules=[], fragment_schedule_rules=[],
        phases=phase.ALL)
    ifrt = extension.clone_mlir_module(result.mpmd_module)
    extension.lower_to_ifrt(ifrt)
    devices = [d for ds in meshes.values() for d in ds]
    out = jax.sharding.NamedSharding(Mesh(np.array(meshes["second"]), ("x",)),
                                     jax.sharding.PartitionSpec())
    return extension.compile_mpmd(
        proxy_devices[0].client, ifrt, devices,
        [jax.core.ShapedArray((8, 2), np.float32)], [out],
        xla_compile_options=extension.get_compile_options(ifrt, {})), meshes


def test_shardy_program_runs_and_describes_itself(proxy_devices):
  exe, meshes = _compiled(proxy_devices)
  rng = np.random.default_rng(1)
  x = rng.normal(size=(8, 4)).astype(np.float32)
  w0 = rng.normal(size=(4, 4)).astype(np.float32)
  w1 = rng.normal(size=(4, 2)).astype(np.float32)
  first = jax.sharding.NamedSharding(Mesh(np.array(meshes["first"]), ("x",)),
                                     jax.sharding.PartitionSpec())
  second = jax.sharding.NamedSharding(
      Mesh(np.array(meshes["second"]), ("x",)), jax.sharding.PartitionSpec())
  args = [jax.device_put(x, first), jax.device_put(w0, first),
          jax.device_put(w1, second)]
  (y,) = exe.execute(args)
  expected = 2 * (np.tanh(x @ w0) @ w1)
  np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5)
  assert {d.id for d in y.sharding.device_set} == {4, 5}

  assert len(exe.input_shardings()) == 3
  assert len(exe.output_shardings()) == 1
  costs = exe.cost_analysis()
  assert set(costs) == {"first", "second"}
  assert costs["first"]["flops"] > 0 and costs["second"]["flops"] > 0
  assert set(exe.get_compiled_memory_stats()) == {"first", "second"}

  # An argument on the wrong island: a clear error, the program still works.
  wrong = [jax.device_put(x, second), args[1], args[2]]
  with pytest.raises(jax.errors.JaxRuntimeError,
                     match=r"argument 0 is on devices \[4, 5\] but the MPMD "
                     r"program takes it on devices \[0, 1\]"):
    np.asarray(exe.execute(wrong)[0])
  np.testing.assert_allclose(np.asarray(exe.execute(args)[0]), expected,
                             rtol=1e-5)


def test_arguments_that_do_not_fit_are_refused(proxy_devices):
  """Checked against the program before any fragment is launched: the
  wrong count, shape, dtype or devices fail the call, and the executable
  still runs with the right ones."""
  exe, meshes = _compiled(proxy_devices)

  def on(mesh, value):
    return jax.device_put(value, jax.sharding.NamedSharding(
        Mesh(np.array(meshes[mesh]), ("x",)), jax.sharding.PartitionSpec()))

  x = np.ones((8, 4), np.float32)
  w0 = np.ones((4, 4), np.float32)
  w1 = np.ones((4, 2), np.float32)
  cases = [
      ([on("first", x), on("first", w0)], "takes 3 arguments, not 2"),
      ([on("first", x), on("first", x), on("second", w1)],
       "argument 1 is float32[8, 4] but the program takes float32[4, 4]"),
      ([on("first", x), on("first", w0.astype(np.int32)), on("second", w1)],
       "argument 1 is int32[4, 4]"),
      ([on("first", x), on("second", w0), on("second", w1)],
       "argument 1 is on devices [4, 5]"),
  ]
  for args, words in cases:
    with pytest.raises(Exception) as e:
      (y,) = exe.execute(args)
      np.asarray(y)
    assert words in str(e.value)
  (y,) = exe.execute([on("first", x), on("first", w0), on("second", w1)])
  np.testing.assert_allclose(np.asarray(y), 2 * (np.tanh(x @ w0) @ w1),
                             rtol=1e-5)


def test_a_stage_that_calls_back_is_refused_clearly(proxy_devices):
  # jax_pathways serves callbacks in SPMD programs, not in pipeline stages:
  # a stage with one (here a host callback) says so when compiled.
  calling_back = PROGRAM.replace(
      "%1 = stablehlo.tanh %0 : tensor<8x4xf32>",
      "%1 = stablehlo.tanh %0 : tensor<8x4xf32>\n"
      '      stablehlo.custom_call @xla_ffi_python_cpu_callback(%1) {'
      'backend_config = "", has_side_effect = true, '
      "mhlo.backend_config = {index = 0 : ui64}} : (tensor<8x4xf32>) -> ()")
  with pytest.raises(Exception, match="not yet inside MPMD pipeline stages"):
    _compiled(proxy_devices, calling_back)
