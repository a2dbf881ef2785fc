"""jax_pathways.elastic: training goes on through a SIGKILLed worker and a
SIGSTOPped one, on an embedded cluster and on a CLI cluster over TCP.

With the islands back (the embedded supervisor, or the CLI cluster's
restart policy, starts new workers) the final parameters are bit-identical
to a run of the same steps without faults; with fewer islands training goes
on, resharded, and the loss keeps falling. Each run is a client subprocess
(tests/elastic/training_run.py) with a cluster of its own."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

import restarting_cluster
import processes

pytestmark = pytest.mark.integration

RUN = os.path.join(os.path.dirname(__file__), "training_run.py")
WORKER_TIMEOUT = 2.0  # seconds of silence before a worker is lost


def _train(settings: dict, timeout: float = 240.0,
           env: dict | None = None) -> dict:
  """Runs training_run.py (with `env` added to this process's); its
  result. Every pid it hurt is gone after."""
  proc = subprocess.Popen(
      [sys.executable, RUN, json.dumps(settings)], stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, start_new_session=True,
      cwd=tempfile.gettempdir(), env=dict(os.environ, **(env or {})))
  try:
    out, err = proc.communicate(timeout=timeout)
  finally:
    processes.stop([proc])
  assert proc.returncode == 0, err[-4000:]
  result = json.loads(out.strip().splitlines()[-1])
  for h in result["hurt"]:  # only the very process it hurt, if it lives
    started = processes.started(h["pid"])
    if started is not None and started == h["started"]:
      os.kill(h["pid"], 9)
  return result


def _losses_fall(result: dict, fault_step: int) -> None:
  """The loss keeps falling on fewer islands: the mean over the last steps
  is below the mean over the steps before the fault (batches differ from
  step to step, so single losses are noisy)."""
  losses = dict(result["losses"])  # a step run again: its last loss
  before = [losses[s] for s in range(fault_step - 3, fault_step + 1)]
  tail = [losses[s] for s in sorted(losses)[-4:]]
  assert sum(tail) / 4 < sum(before) / 4, (before, tail)


def _check_lost(event: dict, island: int, commit_every: int) -> None:
  assert event["kind"] == "lost"
  assert island in event["lost"], event
  assert "DATA_LOSS" in event["error"], event
  # Resumed from the last commit: no committed step lost.
  assert event["resumed_step"] % commit_every == 0, event
  assert 0 <= event["failed_step"] - event["resumed_step"] <= (
      commit_every + 16), event  # 16: launches in flight before the error


# A capped address space counts reservations: glibc gives each new thread
# an arena of 64 MiB (reserved, mostly untouched) unless told to share two.
CAPPED_ENV = {"MALLOC_ARENA_MAX": "2"}

REJOIN = {"steps": 30, "commit_every": 5, "rejoin_timeout": 60.0,
          "faults": [[8, "kill", 1], [19, "stop", 0]], "reference": True}

SHRINK = {"steps": 36, "commit_every": 4, "rejoin_timeout": 0.5,
          "faults": [[8, "kill", 2], [20, "stop", 1]], "grow": False}


def _check_rejoined(result: dict) -> None:
  assert result["islands"] == [0, 1]
  events = result["events"]
  assert [e["kind"] for e in events] == ["lost", "lost"], events
  _check_lost(events[0], 1, REJOIN["commit_every"])
  _check_lost(events[1], 0, REJOIN["commit_every"])
  assert all(e["islands"] == [0, 1] for e in events), events
  assert result["params"] == result["reference"]


def _check_shrunk(result: dict) -> None:
  events = result["events"]
  assert [e["islands"] for e in events] == [[0, 1], [0]], events
  _check_lost(events[0], 2, SHRINK["commit_every"])
  _check_lost(events[1], 1, SHRINK["commit_every"])
  _losses_fall(result, 8)
  _losses_fall(result, 20)


def test_embedded_cluster_islands_rejoin_bit_identical():
  _check_rejoined(_train(dict(REJOIN, islands=2, devices=2,
                              worker_timeout=WORKER_TIMEOUT)))


def test_a_state_beyond_the_clients_memory_commits_and_recovers():
  """640 MiB of the state is made on the devices; the client's address
  space is then capped 448 MiB above what it has (it tries to allocate
  640 MiB, and fails; the rest is room for its threads' stacks): its commits are saved by the workers under their
  storage root, and a killed worker's island comes back from the last one,
  bit-identical. A CLI cluster: the embedded one's workers would be the
  capped process's children, and inherit its cap."""
  commit_every = 4
  with restarting_cluster.started(2, 2, WORKER_TIMEOUT) as cluster:
    result = _train({"address": cluster.address,
                     "token": restarting_cluster.TOKEN, "steps": 12,
                     "commit_every": commit_every, "rejoin_timeout": 60.0,
                     "commit_dir": os.path.join(cluster.storage, "commits"),
                     "reference": True, "faults": [[6, "kill", 1]],
                     "ballast_mib": 640, "cap_headroom_mib": 448},
                    env=CAPPED_ENV)
    assert cluster.restarts == 1
  assert result["could_hold_state"] is False
  [event] = result["events"]
  _check_lost(event, 1, commit_every)
  assert result["ballast_kept"] is True
  assert result["params"] == result["reference"]


def test_embedded_cluster_goes_on_with_fewer_islands():
  _check_shrunk(_train(dict(SHRINK, islands=3, devices=2,
                            worker_timeout=WORKER_TIMEOUT,
                            restart_workers=False)))


def test_a_given_up_island_is_brought_back_and_training_grows_onto_it():
  """Six quick kills of island 1's worker: the supervisor gives up (its
  restarts 5); the loss event says so and what to do; the client brings
  the island back (restart_worker) and training grows onto it."""
  commit_every = 4
  result = _train({"islands": 2, "devices": 2, "steps": 24,
                   "commit_every": commit_every, "rejoin_timeout": 0.5,
                   "worker_timeout": WORKER_TIMEOUT, "restart_delays": [0.0],
                   "faults": [[8, "hammer", 1]], "bring_back": True})
  assert len(result["hurt"]) == 6, result["hurt"]
  events = result["events"]
  assert [(e["kind"], e["islands"]) for e in events] == [
      ("lost", [0]), ("grew", [0, 1])], events
  _check_lost(events[0], 1, commit_every)
  assert "island 1: its supervisor gave up" in events[0]["given_up"]
  assert "6 times in a row" in events[0]["given_up"], events[0]
  assert "restart_worker(1)" in events[0]["given_up"], events[0]
  assert result["islands"] == [0, 1]
  _losses_fall(result, 8)


def test_cli_cluster_islands_rejoin_bit_identical():
  with restarting_cluster.started(2, 2, WORKER_TIMEOUT) as cluster:
    result = _train(dict(REJOIN, address=cluster.address,
                         token=restarting_cluster.TOKEN))
    assert cluster.restarts == 2
  _check_rejoined(result)


def test_cli_cluster_goes_on_with_fewer_islands():
  with restarting_cluster.started(3, 2, WORKER_TIMEOUT,
                                  restart=False) as cluster:
    result = _train(dict(SHRINK, address=cluster.address,
                         token=restarting_cluster.TOKEN))
  _check_shrunk(result)
