"""Pipeline steps across a lost island's rejoin (a cluster of its own, in a
subprocess: rejoin_client.py). The step over the lost island fails with
DATA_LOSS naming it; one over other islands runs on meanwhile; once the
supervisor's new worker serves the island, the same compiled steps (Shardy
and the own splitter) give the bits they gave before the loss, and their
outputs there combine with the island's other arrays; a step on parameters
lost with the island fails with the loss's words."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import processes  # tests/conftest.py puts tests/ on sys.path

pytestmark = pytest.mark.integration

CLIENT = os.path.join(os.path.dirname(__file__), "rejoin_client.py")
SPLITTERS = ["shardy", "jax_pathways"]


def test_pipeline_steps_survive_a_lost_island_that_rejoins():
  began = time.monotonic()
  env = {k: v for k, v in os.environ.items()
         if not k.startswith("JAX_PATHWAYS_")}
  client = subprocess.Popen([sys.executable, CLIENT, *SPLITTERS], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
  phases: dict[str, dict] = {}
  try:
    out, err = client.communicate(timeout=180)
    for line in out.splitlines():
      if line.startswith("{"):
        phase = json.loads(line)
        phases[phase["phase"]] = phase
    assert client.returncode == 0, err[-4000:]
  finally:
    if client.poll() is None:
      client.kill()
      client.communicate(timeout=10)
    # pid -> when it started: the same pid later may be another process.
    pids = {int(p): t for p, t in
            phases.get("started", {}).get("pids", {}).items()}
    if "rejoined" in phases:
      pids[phases["rejoined"]["island"]["pid"]] = (
          phases["rejoined"]["island_started"])

    def lives(pid: int) -> bool:
      return (pids[pid] is not None and processes.alive(pid) and
              processes.started(pid) == pids[pid])

    # Every process of the cluster, the restarted worker too, ends with it.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(map(lives, pids)):
      time.sleep(0.1)
    left = [p for p in pids if lives(p)]
    for p in left:
      os.kill(p, signal.SIGKILL)
  assert not left, left

  before = phases["before"]["steps"]
  assert phases["before"]["partitioners"] == {**{s: s for s in SPLITTERS},
                                              "other": "shardy"}
  for name, got in before.items():
    assert got["ref_error"] <= 1e-5, (name, got)   # pipeline_test's bound
  # The same bits from both splitters here (one device per stage).
  assert len({got["digest"] for got in before.values()}) == 1, before

  lost = phases["lost"]
  victim = f"island 1 (worker pid {phases['started']['victim']} on "
  for name in SPLITTERS:   # every output, on either island
    for error in lost["steps"][name]["errors"]:
      assert error.startswith("JaxRuntimeError: DATA_LOSS"), (name, error)
      assert victim in error, (name, error)
  assert lost["steps"]["other"] == before["other"], lost
  # Those steps met the island lost, not back already.
  assert not lost["island"]["alive"] and lost["island"]["generation"] == 0

  rejoined = phases["rejoined"]
  assert rejoined["island"]["generation"] == 1, rejoined["island"]
  assert rejoined["steps"] == before, rejoined
  assert rejoined["assembled"] == {s: {"same": True} for s in SPLITTERS}
  # Parameters from before the loss fail the step in C++ (the fast path
  # took it: one Execute of the MPMD program, or one per fragment) with the
  # loss's words, and the next step on good parameters gives the same bits
  # again (a receive left waiting for bytes that never come would hold
  # its worker's reports, and that step, for ever).
  stale = phases["stale"]
  for name in SPLITTERS:
    assert stale["steps"][name]["fast_path"] >= 1, stale
    for error in stale["steps"][name]["errors"]:
      assert error.startswith("JaxRuntimeError: DATA_LOSS"), (name, error)
      assert victim in error, (name, error)
  assert stale["after"] == {s: before[s] for s in SPLITTERS}, stale
  print(f"loss seen -> failed steps {lost['took_s']:.2f} s; rejoined -> "
        f"first steps (fragments compiled again on the new worker) "
        f"{rejoined['took_s']:.2f} s; whole test "
        f"{time.monotonic() - began:.1f} s")
