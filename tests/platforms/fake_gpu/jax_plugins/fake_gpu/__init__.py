"""A JAX plugin for tests: registers platform "rocm" as a CPU client, so
that a CPU host can run an island of a GPU platform's name
(tests/platforms/named_gpu_test.py). JAX finds it as it finds the real
plugins: a module of the jax_plugins namespace on the path, whose
initialize() it calls."""
from jax._src import xla_bridge
from jax._src.lib import xla_client as xc


def initialize() -> None:
  xla_bridge.register_backend_factory(
      "rocm", lambda: xc.make_cpu_client(num_devices=2), priority=500)
