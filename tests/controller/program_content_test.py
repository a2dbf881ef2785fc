"""Programs as a hostile client sends them, raw: custom calls that would make
a worker's XLA follow a pointer or call into the client's memory, targets
no island runs, nesting deep enough to overflow a reader's stack, unknown
dialects, a value larger than the cluster. Each is refused with
INVALID_ARGUMENT naming what is wrong; no worker dies, the controller
serves the next request, and an honest program still runs."""
from __future__ import annotations

import numpy as np
import pytest
from jax._src import compiler
from jaxlib.mlir.dialects import stablehlo

from jax_pathways import admin
from jax_pathways.wire import protos

import fuzz  # noqa: E402  tests/controller/conftest.py puts it on sys.path

pytestmark = pytest.mark.integration

INVALID_ARGUMENT = 3
# encode_inspect_sharding_callback's 16 bytes: a function pointer and its
# argument, here made up.
POINTER = "\\10\\05\\CA\\FC\\50\\7F\\00\\00\\40\\C5\\DF\\03\\51\\7F\\00\\00"


def _artifact(text: str) -> bytes:
  return stablehlo.serialize_portable_artifact_str(
      text, stablehlo.get_current_version())


def _program(body: str, attributes: str = "", sharding: str = "") -> bytes:
  """@main(x: f32[8]) runs `body` on %arg0 and returns it."""
  return _artifact(f"""module @m {attributes} {{
    func.func public @main(%arg0: tensor<8xf32> {sharding}) ->
        tensor<8xf32> {{
      {body}
      return %arg0 : tensor<8xf32>
    }}
  }}""")


def _custom_call(target: str, config: str, typed: str = "") -> str:
  extra = f", mhlo.backend_config = {typed}" if typed else ""
  return (f"stablehlo.custom_call @{target}(%arg0) {{backend_config = "
          f'"{config}", has_side_effect = true{extra}}} : '
          "(tensor<8xf32>) -> ()")


def _compile(session, program: bytes, devices: int = 1):
  options = protos.msg("xla.CompileOptionsProto").FromString(
      compiler.get_compile_options(
          num_replicas=1, num_partitions=devices,
          device_assignment=np.arange(devices).reshape(1, devices))
      .SerializeAsString())

  def fill(b):
    b.program.type_name = "xla::ifrt::XlaProgram"
    b.program.data = program
    b.compile_options.type_name = "xla::ifrt::XlaCompileOptions"
    b.compile_options.data = protos.msg("xla.ifrt.XlaCompileOptionsProto")(
        compile_options=options).SerializeToString()

  return session.call(compile_request=fill)


def _refused(reply, *words: str) -> None:
  status = reply.response_metadata.status
  assert status.code == INVALID_ARGUMENT, reply
  for w in words:
    assert w in status.message, status.message


@pytest.fixture
def cluster_lives(pathways, raw_session):
  """The workers' pids before; after the test, the same workers, and an
  honest program that still compiles."""
  def pids():
    return [i["pid"] for i in
            admin.status(pathways.address, pathways.token)["islands"]]
  before = pids()
  yield
  assert pids() == before, "a worker died"
  reply = _compile(raw_session(), _program(""))
  assert reply.response_metadata.status.code == 0, reply


@pytest.mark.parametrize("devices", [1, 4, 8])
def test_a_forged_inspect_sharding_is_refused(raw_session, cluster_lives,
                                              devices):
  # JAX's own client writes a pointer of its process here; on 52b5207 a
  # worker's XLA called it while partitioning, and died.
  reply = _compile(raw_session(), _program(
      _custom_call("InspectSharding", POINTER)), devices)
  _refused(reply, "jax.debug.inspect_array_sharding",
           "does not serve callbacks")


def test_a_forged_custom_partitioning_is_refused(raw_session, cluster_lives):
  reply = _compile(raw_session(), _program(
      _custom_call("CustomSPMDPartitioning", "139912981814672")), 4)
  _refused(reply, "jax.experimental.custom_partitioning")


@pytest.mark.parametrize("attributes", [
    "", 'attributes {jax_pathways.host_callbacks = "1:1"}'])
def test_a_forged_host_callback_is_refused(raw_session, cluster_lives,
                                           attributes):
  # An FFI callback with no callable bound: XLA would call whatever jaxlib
  # finds at that index (nothing, on a worker).
  reply = _compile(raw_session(), _program(
      _custom_call("xla_ffi_python_cpu_callback", "",
                   "{index = 0 : ui64}"), attributes))
  _refused(reply, "calls back into Python", "does not serve callbacks")


@pytest.mark.parametrize("target", ["xla_python_cpu_callback", "evil",
                                    "jax_pathways.CustomSPMDPartitioning"])
def test_targets_no_island_runs_are_refused(raw_session, cluster_lives,
                                            target):
  reply = _compile(raw_session(), _program(_custom_call(target, POINTER)))
  _refused(reply, f"custom call target {target!r}", "do not run")


def test_a_value_larger_than_the_cluster_is_refused(raw_session,
                                                    cluster_lives):
  reply = _compile(raw_session(), _program(
      "%c = stablehlo.constant dense<1.0> : tensor<4000000000000xf32>"))
  _refused(reply, "16000000000000 bytes", "more than the")


def test_unknown_dialects_and_garbage_are_refused(raw_session,
                                                  cluster_lives):
  session = raw_session()
  for program in (b"not a program", b"ML\xefR" + bytes(range(256)) * 8,
                  b'module { "evil.op"() : () -> () }'):
    _refused(_compile(session, program), "does not read as StableHLO")


def test_a_program_nested_too_deep_is_refused(raw_session, cluster_lives):
  # Deep enough to overflow a default thread stack that reads it (8 MiB;
  # the controller read programs on its own thread on 52b5207), as MLIR
  # text, which the controller reads as well as a portable artifact.
  depth = 20000
  program = (f"module @m {{ func.func public @main() -> tensor<f32> {{\n"
             f"{fuzz.nested(depth)}\nreturn %r{depth} : tensor<f32>\n}} }}")
  reply = _compile(raw_session(), program.encode())
  _refused(reply, "could not be read", "killed its reader")
