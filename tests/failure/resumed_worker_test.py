"""A CLI worker stopped (SIGSTOP) until its controller declared it lost,
then resumed (SIGCONT): it runs nothing more and exits with EXIT_LOST (3),
saying why, so that a restart policy starts a new worker (exit 0 means its
controller is gone). Every process is stopped by pid."""
import json
import os
import secrets
import signal
import subprocess
import sys
import time

import pytest

from jax_pathways import admin
from jax_pathways.worker.join import EXIT_LOST

import processes  # tests/conftest.py puts tests/ on sys.path

pytestmark = pytest.mark.integration

WORKER_TIMEOUT_S = 2.0


def _wait_for(what, predicate, timeout):
  deadline = time.monotonic() + timeout
  while not predicate():
    assert time.monotonic() < deadline, f"{what} within {timeout} s"
    time.sleep(0.05)


@pytest.mark.parametrize("replaced", [False, True], ids=["lost", "replaced"])
def test_a_resumed_lost_worker_exits_with_exit_lost(tmp_path, replaced):
  token = secrets.token_hex(16)
  env = dict(os.environ, JAX_PATHWAYS_TOKEN=token)
  env.pop("JAX_PLATFORMS", None)
  cli = [sys.executable, "-m", "jax_pathways.cli"]
  procs = []

  def spawn(args, log):
    p = subprocess.Popen(cli + args, env=env, cwd=tmp_path,
                         stdout=subprocess.PIPE if log is None else log,
                         stderr=subprocess.DEVNULL if log is None else log,
                         start_new_session=True)
    procs.append(p)
    return p

  try:
    controller = spawn(["controller", "--islands", "1", "--worker-timeout",
                        str(WORKER_TIMEOUT_S)], None)
    ready = json.loads(controller.stdout.readline())

    def island():  # {} until a worker has registered
      islands = admin.status(ready["address"], token, timeout=5)["islands"]
      return islands[0] if islands else {}

    def worker(name):
      with open(tmp_path / f"{name}.log", "wb") as log:
        return spawn(["worker", "--controller", ready["worker_address"],
                      "--island", "0", "--devices", "1"], log)

    old = worker("old")
    _wait_for("the worker joined", lambda: island().get("alive"), 60)
    processes.freeze(old.pid)
    _wait_for("the stopped worker lost", lambda: not island()["alive"],
              WORKER_TIMEOUT_S + 5)
    if replaced:
      new = worker("new")
      _wait_for("a new worker took its place",
                lambda: island()["pid"] == new.pid and island()["alive"], 60)
    os.kill(old.pid, signal.SIGCONT)
    resumed_at = time.monotonic()
    assert old.wait(timeout=10) == EXIT_LOST
    print(f"SIGCONT -> exit {time.monotonic() - resumed_at:.2f} s")
    log = (tmp_path / "old.log").read_text(errors="replace")
    assert "is up but has dropped this worker of island 0" in log, log[-3000:]
    if replaced:
      assert f"worker pid {new.pid}" in log and "has taken its place" in log, (
          log[-3000:])
      assert island()["alive"]  # the new worker serves on
    else:
      assert "--worker-timeout" in log, log[-3000:]
  finally:
    for p in procs:
      if p.poll() is None:
        os.kill(p.pid, signal.SIGCONT)
    processes.stop(procs)
