"""An island of a GPU platform's name, from a client with no GPU backend.

On a CPU host, fake_gpu/ is a JAX plugin that registers platform "rocm" as
a CPU client. An island of it (`platform="rocm"`) must report "rocm",
JAX's name of what it runs, for which a client without any GPU backend
lowers: an island reporting jaxlib's "gpu" (what its CUDA client calls
itself) failed that client's eager ops ("Unknown backend: 'gpu'
requested", seen on an H200 island). The results are plain JAX's on the
CPU.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

HERE = os.path.dirname(os.path.abspath(__file__))

_CLIENT = textwrap.dedent("""
    import json
    import jax_pathways
    jax_pathways.initialize(islands=1, devices_per_island=2, platform="rocm")
    import jax, jax.numpy as jnp, numpy as np

    def work():
      key = jax.random.key(0)  # eager: lowered for the island's platform
      x = jax.random.normal(key, (64, 8))
      w = jnp.ones((8, 4)) * 0.1
      loss = lambda w: jnp.mean(jax.nn.gelu(x @ w) ** 2)
      value, grad = jax.jit(jax.value_and_grad(loss))(w)
      return [np.asarray(a).tobytes().hex() for a in (x, value, grad)]

    proxy = jax.devices("proxy")
    with jax.default_device(proxy[0]):
      got = work()
    with jax.default_device(jax.devices("cpu")[0]):
      want = work()
    backend = jax._src.xla_bridge.get_backend("proxy")
    print(json.dumps({"devices": sorted({d.platform for d in proxy}),
                      "backend": [backend.platform, backend._raw_platform],
                      "backends": sorted(jax._src.xla_bridge.backends()),
                      "same_bits": got == want}))
    jax_pathways.shutdown()
""")


def test_a_gpu_named_island_serves_a_client_without_a_gpu():
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)
  env["PYTHONPATH"] = os.pathsep.join(
      [os.path.join(HERE, "fake_gpu")] +
      [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
  out = subprocess.run([sys.executable, "-c", _CLIENT], env=env,
                       capture_output=True, text=True, timeout=240,
                       check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  # As plain JAX's on a GPU: devices and backend say "gpu" (jaxlib's
  # alias); JAX lowers for the raw name, the island's.
  assert result == {"devices": ["gpu"], "backend": ["gpu", "rocm"],
                    "backends": ["cpu", "proxy"], "same_bits": True}, result
