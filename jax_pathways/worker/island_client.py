"""The island's PJRT client: jaxlib's CPU client with emulated devices, or
the client JAX's own PJRT plugin for another platform makes (see BUILD.md,
"Adding a device backend")."""
from __future__ import annotations

import os
import re
from typing import Any

from jax._src import xla_bridge
from jax._src.lib import xla_client as xc
from jax.extend import backend as jax_backend

from jax_pathways import config


class PlatformError(Exception):
  """This host cannot give the island the platform or devices asked for."""


def _spare_threads(num_devices: int) -> None:
  """Gives this process's CPU clients (the island's, the global ones) a
  thread per device beyond one per core (XLA sizes their pools by the
  NPROC variable, else by the cores). A program runs on one pool thread per
  device; when it waits on every device (one of them in a callback: a
  client's io_callback may take minutes), copies and programs of one device
  still find threads, as in one JAX process with more cores than devices.
  A value the user set is kept."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
      else (os.cpu_count() or 1)
  os.environ.setdefault("NPROC", str(max(cores, num_devices) + num_devices))


def island_client(platform: str | None, num_devices: int | None) -> Any:
  """The island's PJRT client. `platform`: a JAX platform name (cpu, cuda,
  rocm, tpu, ...; None: JAX's default backend on this host, among those
  JAX_PLATFORMS allows). CPU gets a client of its own with `num_devices`
  emulated devices (None: the configured default); any other platform's
  comes from JAX's own backend registry, i.e. the PJRT plugin its jax extra
  installs (jax-cuda12-plugin, libtpu), with every device it shows
  (`num_devices`, when given, must match)."""
  try:
    if platform is None:
      platform = jax_backend.get_backend().platform
      if platform == "cpu":
        # Not JAX's CPU client: the island's, made below, and JAX's 'cpu'
        # backend becomes it (PjrtBackend.__init__).
        jax_backend.clear_backends()
    if platform == "cpu":
      num_devices = num_devices or config.from_env().devices_per_island
      _spare_threads(num_devices)
      return xc.make_cpu_client(asynchronous=True, num_devices=num_devices)
    found = jax_backend.get_backend(platform)
  except (RuntimeError, AssertionError) as e:
    # JAX skips CUDA without a visible GPU and then asserts it found a
    # backend; its own hint (about JAX_PLATFORMS) is not the worker's fix.
    why = re.sub(r"\s*\(set JAX_PLATFORMS=.*\)\s*$", "", str(e))
    why = why.rstrip(".") or f"it sees no {platform} device"
    raise PlatformError(
        f"JAX cannot make a {platform or 'default'} client on this host: "
        f"{why}. Install the platform's PJRT plugin where its devices are "
        f"(e.g. pip install 'jax_pathways[cuda12]'), or pick another "
        f"--platform") from None
  count = len(found.local_devices())
  if num_devices is not None and num_devices != count:
    raise PlatformError(
        f"--devices={num_devices}, but {found.platform} shows {count} "
        f"devices on this host: an accelerator island takes all of its "
        f"host's (choose them with the platform's own variable, e.g. "
        f"CUDA_VISIBLE_DEVICES)")
  return found


def jax_platform(platform: str | None, client: Any) -> str:
  """The platform name the island reports: JAX's own for the backend it
  runs (cuda, rocm; `platform` as asked, else the client's), which the
  client lowers for. jaxlib's GPU clients call themselves "gpu", an alias
  that JAX resolves only against a GPU backend of its own process, which a
  client of the cluster usually lacks (eager ops there failed: "Unknown
  backend: 'gpu' requested")."""
  return xla_bridge.canonicalize_platform(platform or client.platform)
