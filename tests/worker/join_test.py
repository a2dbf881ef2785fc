"""What a worker reports of its platform, and a platform the host lacks."""
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import types

import pytest

from jax_pathways.resources.topology import Topology
from jax_pathways.status import Code, StatusError
from jax_pathways.worker import join
from jax_pathways.worker import island_client
from jax_pathways.worker.pjrt_backend import PjrtBackend

# Subprocesses start outside the checkout (see tests/cli_test.py).
CWD = tempfile.gettempdir()


class _Device:
  def __init__(self, kind: str, stats: dict[str, int] | None):
    self.device_kind = kind
    self._stats = stats

  def memory_stats(self):
    return self._stats


class _Backend:
  """The slice of PjrtBackend that worker_hello reads."""
  memory_per_device = PjrtBackend.memory_per_device

  def __init__(self, platform: str, devices: list[_Device]):
    self.platform = platform
    self.devices = devices
    # Its PJRT client, as far as the hello asks (jax.export's question).
    self.client = types.SimpleNamespace(serialize_with_sdy=False)


def _admitted(hello):
  island = Topology(1).register(hello)
  return island.platform, island.device_kind, island.memory_bytes


def test_an_accelerator_island_reports_its_platform_kind_and_memory():
  # As a CUDA plugin's client would: the client's platform name ("cuda",
  # not its devices' "gpu") and the devices' bytes_limit.
  gpus = [_Device("NVIDIA H100 80GB HBM3", {"bytes_limit": 60 << 30})] * 2
  hello = join.worker_hello(_Backend("cuda", gpus), 0, 0, "a:1", "")
  assert _admitted(hello) == ("cuda", "NVIDIA H100 80GB HBM3", 120 << 30)
  # What the client's jax.export asks, as the island's PJRT client says.
  assert Topology(1).register(hello).serialize_with_sdy is False
  # --device-memory overrides what the platform reports.
  hello = join.worker_hello(_Backend("cuda", gpus), 0, 16 << 30, "a:1", "")
  assert _admitted(hello)[2] == 32 << 30


def test_cpu_devices_report_no_memory_budget():
  cpus = [_Device("cpu", {})] * 4
  assert _admitted(join.worker_hello(_Backend("cpu", cpus), 0, 0, "a:1",
                                     ""))[2] == 0  # untracked


def test_the_cpu_island_client_is_the_workers_own():
  client = island_client.island_client("cpu", 3)
  assert client.platform == "cpu"
  assert len(client.local_devices()) == 3
  assert {d.device_kind for d in client.local_devices()} == {"cpu"}


def test_an_accelerator_island_refuses_programs_across_islands():
  backend = PjrtBackend.__new__(PjrtBackend)  # as on a CUDA host
  backend.platform, backend.island = "cuda", 1
  assert not backend.spans_islands
  with pytest.raises(StatusError, match="island 1 runs on cuda: programs "
                     "and arrays that span islands need CPU islands") as e:
    backend.device([0, 2])
  assert e.value.status.code == Code.UNIMPLEMENTED


@pytest.mark.integration
@pytest.mark.parametrize("platform,why", [
    pytest.param("cuda", "it sees no cuda device", marks=pytest.mark.skipif(
        os.path.exists("/dev/nvidiactl"), reason="this host has a GPU")),
    pytest.param("tpu", "libtpu", marks=pytest.mark.skipif(
        importlib.util.find_spec("libtpu") is not None,
        reason="libtpu is installed")),
    ("nosuchplatform", "not in the list of known backends"),
])
def test_a_platform_the_host_lacks_fails_at_start(platform, why):
  env = dict(os.environ, JAX_PATHWAYS_TOKEN="t")
  started = time.monotonic()
  # No controller listens at port 1: the platform is checked first.
  out = subprocess.run(
      [sys.executable, "-m", "jax_pathways.cli", "worker", "--controller",
       "127.0.0.1:1", "--platform", platform], env=env, capture_output=True,
      text=True, timeout=60, cwd=CWD)
  assert out.returncode == 2, out.stderr
  assert time.monotonic() - started < 30
  assert (f"jax-pathways worker: --platform {platform}: JAX cannot make a "
          f"{platform} client on this host") in out.stderr
  assert why in out.stderr and "pip install" in out.stderr
  assert "could not join the controller" not in out.stderr


def test_a_platform_name_is_checked_by_the_parser():
  from jax_pathways import cli  # pylint: disable=import-outside-toplevel
  with pytest.raises(SystemExit) as e:
    cli.main(["worker", "--controller", "127.0.0.1:1", "--platform",
              "cuda,cpu"])
  assert e.value.code == 2


# A platform from JAX's registry, as a plugin's would be (a CPU client
# under another name: this machine has no accelerator), in a process whose
# JAX asks for nothing else.
_REGISTERED_PLATFORM = """
import os, sys
os.environ["JAX_PLATFORMS"] = "fakeaccel"
from jax._src import xla_bridge
from jax._src.lib import xla_client as xc
from jax_pathways.worker import island_client
xla_bridge.register_backend_factory(
    "fakeaccel", lambda: xc.make_cpu_client(num_devices=2), priority=500)
client = island_client.island_client("fakeaccel", None)
assert client is xla_bridge.get_backend("fakeaccel")
assert len(client.local_devices()) == 2
try:
  island_client.island_client("fakeaccel", 3)
except island_client.PlatformError as e:
  print(e)
"""


# jaxlib's CUDA client says "gpu" for its platform (seen on an H200): a CPU
# client dressed so, registered as JAX registers a GPU plugin (as "rocm":
# JAX drops a "cuda" backend on a host without an NVIDIA GPU).
_GPU_NAMED_CLIENT = """
import os
os.environ["JAX_PLATFORMS"] = "rocm"
from jax._src import xla_bridge
from jax._src.lib import xla_client as xc
from jax_pathways.worker import island_client

class GpuNamed:
  platform = "gpu"
  def __init__(self):
    self._client = xc.make_cpu_client(num_devices=1)
  def __getattr__(self, name):
    return getattr(self._client, name)

xla_bridge.register_backend_factory("rocm", GpuNamed, priority=500)
# The worker's default platform: JAX's default backend.
print(island_client.jax_platform(None, island_client.island_client(None, None)))
"""


@pytest.mark.integration
def test_a_gpu_client_reports_jaxs_name_for_its_platform():
  # What the client lowers for: "rocm" (or "cuda") needs no GPU backend in
  # the client's process, "gpu" does.
  out = subprocess.run([sys.executable, "-c", _GPU_NAMED_CLIENT],
                       capture_output=True, text=True, timeout=60, cwd=CWD)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == "rocm"


@pytest.mark.integration
def test_another_platform_is_jaxs_own_client_with_all_its_devices():
  out = subprocess.run([sys.executable, "-c", _REGISTERED_PLATFORM],
                       capture_output=True, text=True, timeout=60, cwd=CWD)
  assert out.returncode == 0, out.stderr
  assert out.stdout.startswith("--devices=3, but cpu shows 2 devices on this "
                               "host: an accelerator island takes all"), (
                                   out.stdout)
