"""A placed XlaProgram's key, which the controller's compile cache compares:
the same for the same program traced from another call site or sent with
its options' map fields in another order; different for another program."""
from __future__ import annotations

import itertools
import types

import numpy as np
import pytest
from jaxlib.mlir.dialects import stablehlo

from jax_pathways.programs import xla_program
from jax_pathways.resources.topology import Topology
from jax_pathways.resources.virtual_slice import VirtualSlice
from jax_pathways.status import Code, StatusError
from jax_pathways.wire import protos

# Two call sites, as JAX records them (the whole Python stack).
HERE = 'callsite("f"("a.py":3:9) at "main"("train.py":10:2))'
THERE = 'callsite("f"("a.py":3:9) at "check"("health.py":88:4))'
# The map field the client's jaxlib writes in hash order.
LATENCY_OPTIONS = ["nic_speed_gbps", "rtt_us", "gpus_per_node",
                   "chunk_prep_us"]


def _artifact(constant: np.ndarray, where: str) -> bytes:
  """@main adds `constant` (a float32 vector) to its argument; every op is
  located `where`. As the client sends it: a StableHLO portable
  artifact."""
  t = f"tensor<{constant.size}xf32>"
  text = f"""module @jit_f {{
    func.func public @main(%arg0: {t} loc({where})) -> {t} {{
      %c = stablehlo.constant dense<"0x{constant.tobytes().hex()}"> : {t}
          loc({where})
      %0 = stablehlo.add %arg0, %c : {t} loc({where})
      return %0 : {t} loc({where})
    }} loc({where})
  }} loc({where})"""
  return stablehlo.serialize_portable_artifact_str(
      text, stablehlo.get_current_version())


def _key(program: bytes, latency_options: list[str] = LATENCY_OPTIONS
         ) -> str:
  topology = Topology(1)
  topology.register({"island": 0, "num_devices": 2})
  topology.connected(0)
  options = protos.msg("xla.ifrt.XlaCompileOptionsProto")()
  build = options.compile_options.executable_build_options
  build.num_replicas = build.num_partitions = 1
  for name in latency_options:
    build.debug_options.xla_gpu_analytical_latency_estimator_options[
        name] = "-1"
  return xla_program.place(
      types.SimpleNamespace(type_name=xla_program.XLA_PROGRAM, data=program),
      types.SimpleNamespace(type_name=xla_program.XLA_COMPILE_OPTIONS,
                            data=options.SerializeToString()),
      topology, False, VirtualSlice((0, 1))).key


def test_same_program_from_another_call_site_has_the_same_key():
  c = np.linspace(-1, 1, 1024, dtype=np.float32)
  here, there = _artifact(c, HERE), _artifact(c, THERE)
  assert here != there
  assert _key(here) == _key(there)


def test_options_map_order_does_not_change_the_key():
  program = _artifact(np.ones(4, np.float32), HERE)
  assert len({_key(program, list(order))
              for order in itertools.permutations(LATENCY_OPTIONS)}) == 1


def test_programs_differing_in_a_large_constant_have_different_keys():
  """Nothing is elided: a constant's every element counts."""
  c = np.linspace(-1, 1, 4096, dtype=np.float32)
  d = c.copy()
  d[2000] += 1.0
  assert _key(_artifact(c, HERE)) != _key(_artifact(d, HERE))


def test_unreadable_program_is_refused():
  """Nothing in it could be checked (programs/custom_calls.py), so it goes
  no further than the controller."""
  with pytest.raises(StatusError) as e:
    _key(b"not a program")
  assert e.value.status.code == Code.INVALID_ARGUMENT
  assert "does not read as StableHLO" in e.value.status.message
