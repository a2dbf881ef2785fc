"""What a program may make XLA call: the checks the controller and every
worker run before compiling (programs/custom_calls.py), on programs as JAX
writes them and as an attacker would."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.interpreters import mlir
from jaxlib.mlir import ir

from jax_pathways.programs import custom_calls
from jax_pathways.status import Code, StatusError

ALLOW = custom_calls.allowed(custom_calls.registered("cpu"))
# A pointer-shaped key, as encode_inspect_sharding_callback writes one.
POINTER = "\\00\\00\\00\\00\\11\\22\\33\\44\\00\\00\\00\\00\\55\\66\\77\\88"


def _module(body: str, attributes: str = "") -> custom_calls.Content:
  text = f"""module @m {attributes} {{
    func.func public @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {{
      {body}
      return %arg0 : tensor<4xf32>
    }}
  }}"""
  with mlir.make_ir_context():
    return custom_calls.read(ir.Module.parse(text))


def _call(target: str, config: str = '""', typed: str = "",
          operands: str = "%arg0", types: str = "(tensor<4xf32>) -> ()"
          ) -> str:
  extra = f", mhlo.backend_config = {typed}" if typed else ""
  return (f'stablehlo.custom_call @{target}({operands}) {{backend_config = '
          f'{config}, has_side_effect = true{extra}}} : {types}')


def _refused(content: custom_calls.Content, *words: str,
             serves: bool = True) -> str:
  with pytest.raises(StatusError) as e:
    custom_calls.check(content, ALLOW, "The program",
                       serves_callbacks=serves)
  assert e.value.status.code == Code.INVALID_ARGUMENT
  for w in words:
    assert w in e.value.status.message, e.value.status.message
  return e.value.status.message


def _lowered(f, *args) -> custom_calls.Content:
  """What custom_calls.read finds in JAX's own lowering of f for CPU."""
  with jax.default_device(jax.devices("cpu")[0]):
    text = jax.jit(f).lower(*args).as_text()
  with mlir.make_ir_context() as ctx:
    return custom_calls.read(ir.Module.parse(text, ctx))


@pytest.mark.integration
def test_what_jax_lowers_for_cpu_passes(cpu_devices):
  a = np.eye(4, dtype=np.float32) + 0.5
  for f in (jnp.linalg.inv, jnp.linalg.svd, jnp.linalg.eigh, jnp.linalg.qr,
            jnp.linalg.cholesky, lambda m: jax.lax.approx_max_k(m, 2)):
    content = _lowered(f, a)
    assert content.calls, f
    checked = custom_calls.check(content, ALLOW, "The program",
                                 serves_callbacks=False)
    assert not checked.any


@pytest.mark.integration
def test_host_callbacks_need_a_client_that_serves_them(cpu_devices):
  content = _lowered(lambda x: jax.debug.print("{}", x) or x, np.float32(1))
  assert [c.target for c in content.calls] == ["xla_ffi_python_cpu_callback"]
  _refused(content, "calls back into Python", "jax.debug.print",
           "jax_pathways.initialize(address)", serves=False)
  # Served, but compiled without a table of callables: nothing to run.
  _refused(content, "names no callables for them")


def test_host_callback_indices_are_bound():
  call = _call("xla_ffi_python_cpu_callback", typed="{index = 3 : ui64}")
  checked = custom_calls.check(
      _module(call, 'attributes {jax_pathways.host_callbacks = "7:4"}'),
      ALLOW, "The program", serves_callbacks=True)
  assert (checked.table, checked.count) == (7, 4)
  # An index past the table, and one that is not there at all.
  _refused(_module(call, 'attributes {jax_pathways.host_callbacks = "7:3"}'),
           "names callable index 3", "bound 3", "never run")
  _refused(_module(_call("xla_ffi_python_cpu_callback"),
                   'attributes {jax_pathways.host_callbacks = "7:3"}'),
           "names callable index None")
  for table in ("7", "x:1", "7:0", "7:999999999", "-1:2"):
    _refused(_module(call, 'attributes {jax_pathways.host_callbacks = '
                           f'"{table}"}}'), "is not '<table>:<count>'")


def test_a_forged_inspect_sharding_is_refused():
  forged = _module(_call("InspectSharding", f'"{POINTER}"'))
  _refused(forged, "jax.debug.inspect_array_sharding",
           "does not serve callbacks", serves=False)
  checked = custom_calls.check(forged, ALLOW, "The program",
                               serves_callbacks=True)
  assert checked.compile_time
  # A key of another size is not one JAX wrote.
  _refused(_module(_call("InspectSharding", '"\\01\\02"')),
           "2 bytes", "16-byte key")


def test_a_forged_custom_partitioning_is_refused():
  _refused(_module(_call("CustomSPMDPartitioning", '"140000000000"')),
           "jax.experimental.custom_partitioning", serves=False)
  _refused(_module(_call("CustomSPMDPartitioning", '"../../etc"')),
           "not the key JAX writes")


def test_targets_the_islands_do_not_run_are_refused():
  for target in ("xla_python_cpu_callback",  # a pointer operand
                 "my_ffi_op", "jax_pathways.CustomSPMDPartitioning",
                 "__gpu$xla.gpu.triton"):
    message = _refused(_module(_call(target)), repr(target))
    assert "jax.ffi.register_ffi_target" in message


def test_a_table_without_callbacks_is_refused():
  _refused(_module("", 'attributes {jax_pathways.host_callbacks = "1:1"}'),
           "calls none")


def test_a_value_larger_than_the_islands_is_refused():
  big = ('%c = stablehlo.constant dense<1.0> : tensor<100000000000xf32>')
  content = _module(big)
  assert content.largest_value == 4 * 10**11
  with pytest.raises(StatusError) as e:
    custom_calls.check(content, ALLOW, "The program",
                       serves_callbacks=False, memory_bytes=1 << 30)
  assert "400000000000 bytes" in e.value.status.message
  custom_calls.check(content, ALLOW, "The program", serves_callbacks=False)


def test_nested_regions_are_read():
  loop = """%r = stablehlo.while(%i = %arg0) : tensor<4xf32>
      cond { %t = stablehlo.constant dense<true> : tensor<i1>
             stablehlo.return %t : tensor<i1> }
      do { %u = stablehlo.custom_call @evil(%i) : (tensor<4xf32>) ->
               tensor<4xf32>
           stablehlo.return %u : tensor<4xf32> }"""
  _refused(_module(loop), "'evil'")


def test_registered_cpu_kernels_are_lapacks():
  registered = custom_calls.registered("cpu")
  assert "lapack_sgetrf_ffi" in registered
  assert not registered & custom_calls.SERVED
  assert np.all([t.startswith(("lapack_", "tridiagonal", "cpu_", "sparse"))
                 for t in registered])
