"""Churn: many short client sessions against one controller over TCP, up to
16 at once, about a quarter SIGKILLed in the middle of an upload, a
download, a compile or an execution. Afterwards the controller and workers
are alive, nothing of any client is left in `status`, and a fresh client
computes correctly.

JAX_PATHWAYS_CHURN_SESSIONS raw sessions (default 160; the slow run 1000)
and JAX_PATHWAYS_CHURN_JAX JAX sessions (default 8; slow 40)."""
from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from jax_pathways import admin
from jax_pathways.cluster.local_cluster import LocalCluster

pytestmark = pytest.mark.integration

CHURNER = os.path.join(os.path.dirname(__file__), "churner.py")
AT_ONCE = 16
PER_PROCESS = 10  # raw sessions one churner process runs in turn


class Churner:
  """A churner.py process; its phases are read with deadlines."""

  def __init__(self, cluster: LocalCluster, *args: str):
    self.err = tempfile.TemporaryFile(mode="w+")  # read if it fails
    # JAX's own CPU backend beside the cluster's: the reference.
    env = dict(os.environ, JAX_PLATFORMS="proxy,cpu")
    self.proc = subprocess.Popen(
        [sys.executable, CHURNER, cluster.address, cluster.token, *args],
        env=env, cwd="/", stdout=subprocess.PIPE, stderr=self.err,
        text=True, start_new_session=True)
    self.jax = args[0] == "jax"
    self.killed = False

  def stderr(self) -> str:
    self.err.seek(0)
    return self.err.read()[-3000:]

  def kill(self) -> None:
    if self.proc.poll() is None:
      os.killpg(self.proc.pid, signal.SIGKILL)
    self.killed = True


def _churn(cluster: LocalCluster, raw_sessions: int, jax_sessions: int,
           seed: int) -> dict[str, int]:
  rng = random.Random(seed)
  counts = {"sessions": 0, "killed": 0, "checked": 0}
  kills: dict[str, int] = {}
  running: list[Churner] = []
  jax_left = jax_sessions
  deadline = time.monotonic() + 600
  try:
    while True:
      assert time.monotonic() < deadline, "churn did not finish in 600 s"
      # Raw churners until enough sessions have started (a killed one ends
      # the sessions it had left).
      raw_more = counts["sessions"] + PER_PROCESS * sum(
          not c.jax for c in running) < raw_sessions + jax_sessions
      if not running and not raw_more and not jax_left:
        break
      while len(running) < AT_ONCE and (raw_more or jax_left):
        if jax_left and (not raw_more or rng.random() < 0.2):
          running.append(Churner(cluster, "jax"))
          jax_left -= 1
        else:
          running.append(Churner(cluster, "raw", str(PER_PROCESS)))
        raw_more = counts["sessions"] + PER_PROCESS * sum(
            not c.jax for c in running) < raw_sessions + jax_sessions
      ready, _, _ = select.select([c.proc.stdout for c in running], [], [],
                                  1.0)
      for churner in [c for c in running if c.proc.stdout in ready]:
        line = churner.proc.stdout.readline()
        if not line:  # it ended (killed, done, or failed)
          code = churner.proc.wait(timeout=30)
          assert churner.killed or code == 0, (
              f"a churner exited with {code} unkilled:\n{churner.stderr()}")
          running.remove(churner)
          continue
        msg = json.loads(line)
        if "ok" in msg:
          assert msg["ok"], "a client got wrong results"
          counts["checked"] += 1
        phase = msg.get("phase")
        if phase in ("upload", "compile"):
          counts["sessions"] += 1
        # A quarter of the sessions: each has two phases.
        if phase and rng.random() < (0.5 if churner.jax else 0.125):
          time.sleep(rng.random() * 0.02)  # somewhere inside the phase
          churner.kill()
          counts["killed"] += 1
          kills[phase] = kills.get(phase, 0) + 1
  finally:
    for churner in running:
      churner.kill()
      churner.proc.wait(timeout=30)
  counts.update({f"killed_in_{k}": v for k, v in kills.items()})
  return counts


def _settled(cluster: LocalCluster, timeout: float = 30.0) -> dict:
  deadline = time.monotonic() + timeout
  while True:
    status = admin.status(cluster.address, cluster.token)
    if ((not status["clients"] and not status["live_buffers"] and
         not status["host_buffer_bytes"]) or time.monotonic() > deadline):
      return status
    time.sleep(0.2)


def _run(cluster: LocalCluster, raw_sessions: int, jax_sessions: int,
         seed: int) -> None:
  counts = _churn(cluster, raw_sessions, jax_sessions, seed)
  for pid in cluster.pids:
    os.kill(pid, 0)  # controller and workers alive
  status = _settled(cluster)
  assert status["clients"] == [], json.dumps(status["clients"])
  assert status["live_buffers"] == 0
  assert status["host_buffer_bytes"] == 0
  assert all(i["alive"] for i in status["islands"])
  fresh = Churner(cluster, "jax")
  out, _ = fresh.proc.communicate(timeout=120)
  assert [json.loads(l) for l in out.splitlines()][-2:] == [
      {"ok": True}, {"done": True}], out
  assert counts["killed"] >= counts["sessions"] // 8, counts
  print(f"churn: {counts}")


def test_churned_sessions_leave_nothing(tcp_cluster):
  _run(tcp_cluster,
       int(os.environ.get("JAX_PATHWAYS_CHURN_SESSIONS", "160")),
       int(os.environ.get("JAX_PATHWAYS_CHURN_JAX", "8")), seed=1)


@pytest.mark.slow
def test_churned_sessions_many(tcp_cluster):
  _run(tcp_cluster, 1000, 40, seed=2)
