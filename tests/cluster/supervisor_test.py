"""The embedded cluster's supervisor: a worker that keeps dying is restarted
after growing delays, then given up on with a log line; a stopped worker the
controller declared lost is killed and replaced; stop() stops every process
ever started."""
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from jax_pathways import admin
from jax_pathways.cluster import restarts
from jax_pathways.cluster.local_cluster import LocalCluster

import processes  # tests/conftest.py puts tests/ on sys.path

pytestmark = pytest.mark.integration


def test_a_worker_that_keeps_dying_is_given_up_on(monkeypatch, caplog):
  """Given up on: said in the log with what to do, in `status` with the
  true restart count and pid, in the island's error; then brought back."""
  monkeypatch.setattr(restarts, "RESTART_DELAYS_S", (0.0, 0.2, 0.4))
  monkeypatch.setattr(restarts, "MAX_QUICK_RESTARTS", 3)
  cluster = LocalCluster(1, 1, 4)
  cluster.start()
  try:
    first = cluster.workers[0].pid
    args = cluster._worker_args[0]  # pylint: disable=protected-access
    # Its restarts die at once (the CLI refuses the command).
    cluster._worker_args[0] = ["no-such-command"]  # pylint: disable=protected-access
    with caplog.at_level(logging.WARNING):
      os.kill(first, signal.SIGKILL)
      deadline = time.monotonic() + 60
      while 0 not in cluster._given_up:  # pylint: disable=protected-access
        assert time.monotonic() < deadline, cluster.restarts
        time.sleep(0.05)
    assert cluster.restarts == [3]
    assert any("not restarting island 0's worker again" in r.getMessage() and
               "restart_worker(0)" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    started = [p.pid for p in cluster._started]  # pylint: disable=protected-access
    assert len(started) == 1 + 1 + 3  # controller, first worker, restarts

    [island] = admin.status(cluster.address, cluster.token)["islands"]
    supervisor = island["supervisor"]
    assert supervisor["restarts"] == 3, island
    assert supervisor["pid"] == started[-1] != first, island
    # The kill, then each of the 3 restarts.
    assert "4 times in a row" in supervisor["given_up"], island
    assert "its supervisor gave up restarting its worker" in island["error"]

    # Brought back: the island is served again, and says so.
    cluster._worker_args[0] = args  # pylint: disable=protected-access
    cluster.restart_worker(0)
    deadline = time.monotonic() + 60
    while True:
      [island] = admin.status(cluster.address, cluster.token)["islands"]
      if island["alive"] and not island["joining"]:
        break
      assert time.monotonic() < deadline, island
      time.sleep(0.1)
    assert island["supervisor"] == {
        "island": 0, "pid": cluster.workers[0].pid, "restarts": 4,
        "given_up": ""}, island
    started = [p.pid for p in cluster._started]  # pylint: disable=protected-access
  finally:
    cluster.stop()
  assert not [p for p in started if processes.alive(p)]


# Island 1's program, run by a client process against the cluster; what
# plain numpy says it computes.
CLIENT = """
import sys
import jax_pathways
jax_pathways.initialize(sys.argv[1], token=sys.argv[2])
import jax, numpy as np
x = jax.device_put(np.arange(8, dtype=np.float32), jax.devices()[1])
print(np.asarray(jax.jit(lambda a: a * 2 + 1)(x)).tolist())
"""
WANT = [float(2 * i + 1) for i in range(8)]


def test_a_stopped_worker_declared_lost_is_killed_and_replaced(caplog):
  worker_timeout = 2.0
  cluster = LocalCluster(2, 1, 4, worker_timeout_s=worker_timeout)
  cluster.start()
  old = cluster.workers[1]
  try:
    with caplog.at_level(logging.WARNING):
      processes.freeze(old.pid)
      stopped_at = time.monotonic()
      # Generous: only catches a hang (a replacement's start imports JAX,
      # which took over 10 s in a loaded fresh-clone CI run).
      deadline = stopped_at + worker_timeout + 60
      while True:
        island = {i["island"]: i for i in admin.status(
            cluster.address, cluster.token, timeout=5)["islands"]}[1]
        if island["alive"] and island["pid"] != old.pid:
          break
        assert time.monotonic() < deadline, island
        time.sleep(0.05)
    serving_at = time.monotonic()
    assert old.returncode == -signal.SIGKILL  # killed, and reaped
    assert not processes.alive(old.pid)
    assert island["pid"] == cluster.workers[1].pid
    assert island["generation"] == 1 and island["restarts"] == 1, island
    assert f"pid {old.pid}" in island["last_lost"], island
    assert cluster.restarts == [0, 1]
    assert any(f"island 1 (pid {old.pid}) lost, but its process lives" in
               r.getMessage() for r in caplog.records), [
                   r.getMessage() for r in caplog.records]
    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)
    ran = subprocess.run(
        [sys.executable, "-c", CLIENT, cluster.address, cluster.token],
        env=env, capture_output=True, text=True, timeout=60,
        cwd=tempfile.gettempdir())
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert json.loads(ran.stdout) == WANT, ran.stdout
    print(f"SIGSTOP -> new worker serving {serving_at - stopped_at:.2f} s "
          f"(worker timeout {worker_timeout:g} s)")
  finally:
    if old.poll() is None:
      os.kill(old.pid, signal.SIGCONT)
    started = [p.pid for p in cluster._started]  # pylint: disable=protected-access
    cluster.stop()
  assert not [p for p in started if processes.alive(p)]
