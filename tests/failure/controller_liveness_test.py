"""A stopped controller: its workers notice its silence and exit by
themselves, saying why; resumed, the controller reports their islands lost
instead of hanging. Each test runs its own embedded cluster (no client)."""
import glob
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time

import pytest

from jax_pathways import admin
from jax_pathways.cluster.local_cluster import LocalCluster
from jax_pathways.worker.join import PROBE_TIMEOUT_S

import processes  # tests/conftest.py puts tests/ on sys.path

pytestmark = pytest.mark.integration

# The workers' --controller-timeout (10 s by default; shorter here, past
# the controller's --worker-timeout, as the defaults are: the controller
# decides first). The tests wait for the exits they mean; HANG_S only
# catches a hang (10x what an exit takes: the timeout, one heartbeat
# interval, the probe, the exit itself).
WORKER_TIMEOUT_S = 2.0
CONTROLLER_TIMEOUT_S = 4.0
HANG_S = 10 * (CONTROLLER_TIMEOUT_S + 5.0 + PROBE_TIMEOUT_S)


@pytest.fixture
def cluster(tmp_path):
  c = LocalCluster(2, 1, 4, log_dir=str(tmp_path), start_timeout=120,
                   worker_timeout_s=WORKER_TIMEOUT_S,
                   controller_timeout_s=CONTROLLER_TIMEOUT_S)
  c.start()
  yield c
  if c.controller is not None and c.controller.poll() is None:
    os.kill(c.controller.pid, signal.SIGCONT)
  for w in c.workers:  # one that outlived the test must still be stopped
    if w.poll() is None:
      os.kill(w.pid, signal.SIGCONT)
  c.stop()


def _logs(cluster):
  logs = {}
  for path in sorted(glob.glob(os.path.join(cluster.log_dir, "worker*.log"))):
    with open(path, errors="replace") as f:
      logs[path] = f.read()
  return logs


def _wait_joined(cluster, timeout_s=60):
  """Until every worker serves ops: the controller counts an island once it
  is admitted, before its worker has joined the islands' global client."""
  deadline = time.monotonic() + timeout_s
  while sum("joined as island" in log for log in _logs(cluster).values()
            ) < len(cluster.workers):
    assert time.monotonic() < deadline, _logs(cluster)
    time.sleep(0.1)


def _wait_exit(procs, timeout_s):
  """{pid: seconds until it exited} for each of `procs` that did."""
  start = time.monotonic()
  exited = {}
  while time.monotonic() - start < timeout_s and len(exited) < len(procs):
    for p in procs:
      if p.pid not in exited and p.poll() is not None:
        exited[p.pid] = time.monotonic() - start
    time.sleep(0.05)
  return exited


def _client(cluster, controller_timeout_s: float) -> subprocess.Popen:
  """tests/failure/stalled_client.py on `cluster`, once it is ready."""
  env = dict(os.environ, JAX_PATHWAYS_TOKEN=cluster.token,
             JAX_PATHWAYS_CONTROLLER_TIMEOUT=str(controller_timeout_s))
  env.pop("JAX_PLATFORMS", None)
  client = subprocess.Popen(
      [sys.executable, os.path.join(os.path.dirname(__file__),
                                    "stalled_client.py"), cluster.address],
      env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)
  assert client.stdout.readline() == "ready\n", client.communicate(timeout=60)
  return client


def test_workers_of_a_stopped_controller_exit_and_say_why(cluster):
  controller = cluster.controller.pid
  _wait_joined(cluster)
  client = _client(cluster, controller_timeout_s=3)
  processes.freeze(controller)
  # The client's call waiting on the stopped controller fails once the
  # controller has not answered its pings for 3 s, and so do later ones.
  client.stdin.write("go\n")
  client.stdin.close()
  client.stdin = None  # communicate() below reads only
  unavailable = ("JaxRuntimeError: UNAVAILABLE: Connection to IFRT proxy "
                 "server was terminated")
  for attempt in ("waiting", "later"):  # bounded by the process's end
    line = client.stdout.readline()
    assert line.startswith(f"{attempt}: {unavailable}"), (
        line, client.communicate(timeout=HANG_S))
  exited = _wait_exit(cluster.workers, HANG_S)
  print("workers exited after (s):", exited)
  assert len(exited) == len(cluster.workers), (
      f"workers {[w.pid for w in cluster.workers if w.pid not in exited]} "
      f"still run {HANG_S} s after their controller stopped")
  for w in cluster.workers:
    assert w.returncode == 0, (w.pid, w.returncode)
  logs = _logs(cluster)
  assert len(logs) == 2
  for path, log in logs.items():
    # Why: the silence, as long as the timeout (not before it: the
    # controller was merely silent).
    assert ("is lost: it sent nothing, not even a heartbeat, for" in log and
            "workers.sock" in log and "--controller-timeout" in log), (
                path, log[-2000:])

  # Resumed, the controller answers at once and has lost both islands
  # (it says so, and nothing spanning them is "ready")...
  os.kill(controller, signal.SIGCONT)
  deadline = time.monotonic() + HANG_S
  while True:  # it reads its workers' closed connections first
    status = admin.status(cluster.address, cluster.token, timeout=5.0)
    islands = status["islands"]
    if not any(i["alive"] for i in islands):
      break
    assert time.monotonic() < deadline, islands
    time.sleep(0.05)
  assert all("is lost" in i["error"] for i in islands), islands
  spanning = status["global_client"]
  # "broken" once built, "failed" if its build was under way.
  assert spanning["state"] in ("broken", "failed"), spanning
  assert "is lost" in spanning["error"], spanning
  # ... and the embedded cluster's supervisor, seeing it answer again,
  # starts both workers again: the cluster serves again.
  deadline = time.monotonic() + HANG_S
  while not all(i["alive"] and not i["joining"] and i["generation"] == 1
                for i in islands):
    assert time.monotonic() < deadline, islands
    time.sleep(0.2)
    islands = admin.status(cluster.address, cluster.token,
                           timeout=5.0)["islands"]
  assert cluster.restarts == [1, 1]
  # The client ended normally (jaxlib aborted at 52b5207 after a death;
  # its exit waits out a background upload's deadline: limitations.md)
  # and said what happened and what to do.
  _, err = client.communicate(timeout=HANG_S)
  assert client.returncode == 0, err[-4000:]
  assert re.search(r"has not answered for \d s \(stopped, wedged or "
                   r"unreachable\)", err), err[-4000:]
  assert "JAX_PATHWAYS_CONTROLLER_TIMEOUT" in err


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGUSR1])
def test_a_clean_stop_ends_every_worker_with_0(cluster, how):
  """0 tells a restart policy not to start another worker (main.py); it
  was 3, "dropped", in 4 of 4 stops: the probe found the listener open."""
  _wait_joined(cluster)
  cluster.controller.send_signal(how)  # USR1: drain, no client to wait for
  procs = [cluster.controller, *cluster.workers]
  exited = _wait_exit(procs, 60)  # a hang guard only
  assert len(exited) == len(procs), [p.pid for p in procs]
  assert [p.returncode for p in procs] == [0] * len(procs)
  for path, log in _logs(cluster).items():
    assert "has dropped this worker" not in log, (path, log[-2000:])


def test_a_live_controller_keeps_its_idle_workers():
  """Heartbeats, not work, keep workers up: an idle cluster outlives the
  controller timeout."""
  c = LocalCluster(1, 1, 4, start_timeout=120,
                   worker_timeout_s=WORKER_TIMEOUT_S,
                   controller_timeout_s=CONTROLLER_TIMEOUT_S)
  c.start()
  try:
    _wait_joined(c)
    # Past the timeout by one heartbeat round trip, as the workers count.
    worker_log = os.path.join(c.log_dir, "worker0.log")
    heartbeats = _wait_exit(c.workers, CONTROLLER_TIMEOUT_S + 2)
    assert not heartbeats, open(worker_log, errors="replace").read()[-2000:]
    islands = admin.status(c.address, c.token)["islands"]
    assert [i["alive"] for i in islands] == [True]
  finally:
    c.stop()


def test_a_worker_joining_the_islands_leaves_a_stopped_controller(tmp_path):
  """A worker whose islands' global client waits for another island (in
  its controller's coordination service) still watches its controller:
  stopped meanwhile, it is noticed and the worker exits, with 0 since the
  silent controller does not answer its probe either (gone), though the
  build waits on in jaxlib."""
  env = dict(os.environ, JAX_PATHWAYS_TOKEN=secrets.token_hex(16))
  env.pop("JAX_PLATFORMS", None)
  cli = [sys.executable, "-m", "jax_pathways.cli"]
  log = open(tmp_path / "worker.log", "wb")
  controller = subprocess.Popen(
      cli + ["controller", "--islands", "2", "--worker-timeout",
             str(WORKER_TIMEOUT_S)], env=env, cwd=tmp_path,
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
  worker = None
  try:
    ready = json.loads(controller.stdout.readline())
    worker = subprocess.Popen(
        cli + ["worker", "--controller", ready["worker_address"],
               "--devices", "1", "--controller-timeout",
               str(CONTROLLER_TIMEOUT_S)], env=env, cwd=tmp_path, stdout=log,
        stderr=log)
    deadline = time.monotonic() + 60
    while not admin.status(ready["address"], env["JAX_PATHWAYS_TOKEN"]
                           )["islands"]:
      assert time.monotonic() < deadline and worker.poll() is None
      time.sleep(0.1)
    time.sleep(1)  # in the join, which waits for island 1
    processes.freeze(controller.pid)
    assert worker.wait(HANG_S) == 0
    text = (tmp_path / "worker.log").read_text(errors="replace")
    assert "controller is gone" in text, text[-2000:]
    assert "is lost: it sent nothing, not even a heartbeat" in text
  finally:
    os.kill(controller.pid, signal.SIGCONT)
    for p in (worker, controller):
      if p is not None and p.poll() is None:
        p.kill()
      if p is not None:
        p.wait(10)
    log.close()
