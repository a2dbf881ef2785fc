"""`jax-pathways status` shows islands, devices and queues."""
import json
import os
import subprocess
import sys
import tempfile

import pytest

pytestmark = pytest.mark.integration

# Subprocesses start outside the checkout: `python -m` / `-c` would import
# its unbuilt sources instead of the installed package.
CWD = tempfile.gettempdir()


def _cli(pathways, *args, token=True):
  env = dict(os.environ)
  env.pop("JAX_PATHWAYS_TOKEN", None)
  if token:
    env["JAX_PATHWAYS_TOKEN"] = pathways.token
  return subprocess.run(
      [sys.executable, "-m", "jax_pathways.cli", "status", "--address",
       pathways.address, *args], env=env, capture_output=True, text=True,
      timeout=60, cwd=CWD)


def test_status_table(pathways, proxy_devices):
  out = _cli(pathways)
  assert out.returncode == 0, out.stderr
  assert "islands alive 2/2" in out.stdout
  assert "0..3" in out.stdout and "4..7" in out.stdout
  assert "clients: 1" in out.stdout
  # Who holds what: this process asked for nothing and holds every device.
  assert "asked all devices, holds devices [0, 1, 2, 3, 4, 5, 6, 7]" in (
      out.stdout)
  assert "weight 1, " in out.stdout and "device-seconds" in out.stdout
  assert "memory MiB" in out.stdout and "untracked" in out.stdout
  assert out.stdout.count("(reads uploads locally)") == 2


def test_status_json(pathways, proxy_devices):
  out = _cli(pathways, "--json")
  status = json.loads(out.stdout)
  assert status["complete"] and len(status["islands"]) == 2
  assert all(i["alive"] for i in status["islands"])
  assert {i["pid"] for i in status["islands"]} == {
      w.pid for w in pathways.workers}
  # Workers of the embedded cluster share the controller's host: they read
  # uploads from its memory.
  assert all(i["reads_locally"] for i in status["islands"])


def test_status_needs_the_token(pathways):
  out = _cli(pathways, token=False)
  assert out.returncode == 1
  assert "UNAUTHENTICATED" in out.stderr


def test_worker_controller_timeout_is_checked():
  out = subprocess.run(
      [sys.executable, "-m", "jax_pathways.cli", "worker", "--controller",
       "127.0.0.1:1", "--controller-timeout", "1"], capture_output=True,
      text=True, timeout=60, cwd=CWD)
  assert out.returncode == 2, out.stderr
  assert "--controller-timeout=1.0 must be >= 2 seconds" in out.stderr


def test_status_finds_this_hosts_clusters_without_an_address(pathways):
  """The embedded cluster's controller lists itself (cluster/host_registry.py):
  plain `jax-pathways status` shows it, with no address or token given."""
  env = {k: v for k, v in os.environ.items()
         if k not in ("JAX_PATHWAYS_TOKEN", "JAX_PATHWAYS_ADDRESS")}
  out = subprocess.run([sys.executable, "-m", "jax_pathways.cli", "status"],
                       env=env, capture_output=True, text=True, timeout=60,
                       cwd=CWD)
  assert out.returncode == 0, out.stderr
  # Other clusters of this host (other test workers') may be listed too.
  assert f"== controller {pathways.address} (pid {pathways.pids[0]}" in (
      out.stdout), out.stdout
  assert "islands alive 2/2" in out.stdout


def test_status_survives_a_closed_pipe(pathways):
  """`status --json | head -1`: the reader goes; no traceback."""
  env = dict(os.environ, JAX_PATHWAYS_TOKEN=pathways.token)
  out = subprocess.run(
      f"{sys.executable} -m jax_pathways.cli status --address "
      f"{pathways.address} --json | head -1", shell=True, env=env,
      capture_output=True, text=True, timeout=60, cwd=CWD)
  assert out.stdout == "{\n", out.stdout
  assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, (
      out.stderr)
