"""A worker killed in the middle of a save: the save fails with why, and
orbax never commits the step: no checkpoint looks complete that is not
(issue 51, item 6)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import cli_cluster
import processes

pytestmark = pytest.mark.integration
CLIENT = os.path.join(os.path.dirname(__file__), "killed_save_client.py")


def test_a_worker_killed_mid_save_commits_nothing(tmp_path):
  from jax_pathways.cluster.local_cluster import LocalCluster  # pylint: disable=import-outside-toplevel
  root = tmp_path / "root"
  root.mkdir()
  path = root / "ck"
  with processes.running(LocalCluster(2, 2, 16,
                                      storage_root=str(root))) as cluster:
    env = dict(os.environ, JAX_PATHWAYS_ADDRESS=cluster.address,
               JAX_PATHWAYS_TOKEN=cluster.token)
    env.pop("JAX_PLATFORMS", None)
    client = subprocess.Popen([sys.executable, CLIENT, str(path), "1024"],
                              env=env, cwd="/", stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
      assert cli_cluster.line(client, 180).get("ready")
      # The save has begun once orbax made its step's temporary folder and
      # the workers write chunks under it.
      deadline = time.monotonic() + 120
      while not any(name.startswith("1") for name in _listing(path)):
        assert time.monotonic() < deadline, "the save never began"
        time.sleep(0.01)
      os.kill(cluster.workers[1].pid, signal.SIGKILL)
      got = cli_cluster.line(client, 240)
    finally:
      if client.poll() is None:
        client.kill()
      client.wait(30)
  assert got["error"], got
  assert "default.orbax-checkpoint-tmp/w: " in got["error"], got["error"]
  assert "worker island 1" in got["error"] and "is lost" in got["error"]
  assert got["steps"] == [], got
  # What is left is orbax's temporary folder, which it never renamed.
  assert all("tmp" in name for name in got["left"]), got["left"]


def _listing(path) -> list[str]:
  try:
    return os.listdir(path)
  except FileNotFoundError:
    return []
