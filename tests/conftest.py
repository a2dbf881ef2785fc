"""Shared fixtures.

Integration tests run in this process against an embedded cluster (2 islands
x 4 emulated CPU devices) and compare with plain JAX on this process's own CPU
backend (8 devices): JAX runs with both backends, 'proxy' as the default and
'cpu' as the reference. Tests that kill processes start clusters of their own
in subprocesses.
"""
from __future__ import annotations

import logging
import os
import sys

# Before JAX initializes: the reference CPU backend gets as many devices as
# the cluster, and both backends exist in this process.
os.environ.setdefault("JAX_PLATFORMS", "proxy,cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from absl import logging as absl_logging  # noqa: E402

import jax_pathways  # noqa: E402

# Shared helpers of the tests (processes.py) import as top-level modules.
sys.path.insert(0, os.path.dirname(__file__))
import bits  # noqa: E402  pylint: disable=wrong-import-position
import processes  # noqa: E402  pylint: disable=wrong-import-position
from suite_order import LONGEST_FIRST  # noqa: E402  pylint: disable=wrong-import-position

ISLANDS = 2
DEVICES_PER_ISLAND = 4

jax.config.update("jax_num_cpu_devices", ISLANDS * DEVICES_PER_ISLAND)


_builds: list = []


def pytest_configure(config) -> None:
  """A run that holds tests/sanitizers/ starts their builds at once, at the
  lowest priority (sanitized.start_builds); once, in xdist's main process."""
  if hasattr(config, "workerinput") or config.getoption("keyword"):
    return
  wanted = os.path.join(os.path.dirname(__file__), "sanitizers")
  for arg in config.args:
    path = os.path.abspath(arg.split("::")[0])
    if os.path.commonpath([path, wanted]) in (path, wanted):
      import sanitized  # pylint: disable=import-outside-toplevel
      _builds.extend(sanitized.start_builds())
      return


def pytest_unconfigure(config) -> None:
  del config
  if _builds:  # a run cut short leaves no compiler behind
    import sanitized  # pylint: disable=import-outside-toplevel
    sanitized.stop_builds(_builds)


@pytest.hookimpl(optionalhook=True)  # with -p no:xdist there is no such hook
def pytest_xdist_auto_num_workers(config) -> int:
  """`-n auto`: a worker per core and one more, at most 4 (each runs
  clusters of its own: controller, workers and their XLA threads). The
  extra one fills the time the others wait on their processes (heartbeat
  timeouts, restarts): on two cores the suite took 690 s with two, 652 s
  with three (the same tree, one run each)."""
  return max(1, min((os.cpu_count() or 1) + 1, 4))



def pytest_collection_modifyitems(config, items) -> None:
  """LONGEST_FIRST's files first, then the others by number of tests; a
  file's own order is kept."""
  del config
  here = os.path.dirname(__file__)
  files: dict[str, list] = {}
  for item in items:
    files.setdefault(os.path.relpath(str(item.path), here), []).append(item)

  def rank(name: str) -> tuple[int, int]:
    if name in LONGEST_FIRST:
      return (LONGEST_FIRST.index(name), 0)
    return (len(LONGEST_FIRST), -len(files[name]))

  items[:] = [item for name in sorted(files, key=rank) for item in files[name]]


@pytest.fixture(autouse=True)
def _logging_left_as_found():
  """Tests that run cli.main() in this process get its process-wide absl
  logging (logs.setup_logging: absl's handler on the root logger, root at
  INFO). Left so, the log capture of every later test keeps its INFO
  records, and with them whatever they reference: jax's cache_key logs, at
  INFO on each compilation, the proxy client's GetTopologyForDevices error,
  whose traceback holds the jitted call's arguments and results until the
  test ends (resources_test saw 8 buffers stay live)."""
  root = logging.getLogger()
  level, verbosity = root.level, absl_logging.get_verbosity()
  absl_handler = absl_logging.get_absl_handler()
  had_absl_handler = absl_handler in root.handlers
  yield
  if not had_absl_handler:
    root.removeHandler(absl_handler)
  absl_logging.set_verbosity(verbosity)
  root.setLevel(level)


@pytest.fixture(scope="session")
def pathways():
  """The embedded cluster; stopped (all pids) at the end of the session."""
  jax_pathways.initialize(islands=ISLANDS,
                          devices_per_island=DEVICES_PER_ISLAND)
  cluster = jax_pathways.local_cluster()
  yield cluster
  jax_pathways.shutdown()
  for pid in cluster.pids:
    assert not processes.alive(pid), f"process {pid} outlived the cluster"


@pytest.fixture(scope="module")
def tcp_cluster():
  """A cluster of the test module's own, whose clients connect over
  loopback TCP as remote ones would (the shared one uses a Unix socket);
  every process stopped by pid at the end of the module."""
  from jax_pathways.cluster.local_cluster import LocalCluster  # pylint: disable=import-outside-toplevel
  with processes.running(LocalCluster(ISLANDS, DEVICES_PER_ISLAND, 16,
                                      tcp=True)) as cluster:
    yield cluster


@pytest.fixture(scope="session")
def proxy_devices(pathways):
  devices = jax.devices("proxy")
  assert len(devices) == ISLANDS * DEVICES_PER_ISLAND
  return devices


@pytest.fixture(scope="session")
def cpu_devices(pathways):
  return jax.devices("cpu")


@pytest.fixture
def run_both(proxy_devices, cpu_devices):
  """run_both(fn): fn(devices) on plain CPU and through jax_pathways; the
  results must be bit-identical. Returns the jax_pathways result."""

  def run(fn):
    with jax.default_device(cpu_devices[0]):
      expected = jax.tree.map(np.asarray, fn(cpu_devices))
    with jax.default_device(proxy_devices[0]):
      actual = jax.tree.map(np.asarray, fn(proxy_devices))
    bits.assert_same(expected, actual)
    return actual

  return run
