"""jax_pathways.elastic: training goes on through a SIGKILLed worker and a
SIGSTOPped one, on an embedded cluster and on a CLI cluster over TCP.

With the islands back (the embedded supervisor, or the CLI cluster's
restart policy, starts new workers) the final parameters are bit-identical
to a run of the same steps without faults; with fewer islands training goes
on, resharded, and the loss keeps falling. Each run is a client subprocess
(tests/elastic/training_run.py) with a cluster of its own."""
from __future__ import annotations

import pytest

import restarting_cluster
from runs import WORKER_TIMEOUT, check_lost, train

pytestmark = pytest.mark.integration


def _losses_fall(result: dict, fault_step: int) -> None:
  """The loss keeps falling on fewer islands: the mean over the last steps
  is below the mean over the steps before the fault (batches differ from
  step to step, so single losses are noisy)."""
  losses = dict(result["losses"])  # a step run again: its last loss
  before = [losses[s] for s in range(fault_step - 3, fault_step + 1)]
  tail = [losses[s] for s in sorted(losses)[-4:]]
  assert sum(tail) / 4 < sum(before) / 4, (before, tail)


REJOIN = {"steps": 30, "commit_every": 5, "rejoin_timeout": 60.0,
          "faults": [[8, "kill", 1], [19, "stop", 0]], "reference": True}

SHRINK = {"steps": 36, "commit_every": 4, "rejoin_timeout": 0.5,
          "faults": [[8, "kill", 2], [20, "stop", 1]], "grow": False}


def _check_rejoined(result: dict) -> None:
  assert result["islands"] == [0, 1]
  events = result["events"]
  assert [e["kind"] for e in events] == ["lost", "lost"], events
  check_lost(events[0], 1, REJOIN["commit_every"])
  check_lost(events[1], 0, REJOIN["commit_every"])
  assert all(e["islands"] == [0, 1] for e in events), events
  assert result["params"] == result["reference"]


def _check_shrunk(result: dict) -> None:
  events = result["events"]
  assert [e["islands"] for e in events] == [[0, 1], [0]], events
  check_lost(events[0], 2, SHRINK["commit_every"])
  check_lost(events[1], 1, SHRINK["commit_every"])
  _losses_fall(result, 8)
  _losses_fall(result, 20)


def test_embedded_cluster_islands_rejoin_bit_identical():
  _check_rejoined(train(dict(REJOIN, islands=2, devices=2,
                              worker_timeout=WORKER_TIMEOUT)))


def test_embedded_cluster_goes_on_with_fewer_islands():
  _check_shrunk(train(dict(SHRINK, islands=3, devices=2,
                            worker_timeout=WORKER_TIMEOUT,
                            restart_workers=False)))


def test_a_given_up_island_is_brought_back_and_training_grows_onto_it():
  """Six quick kills of island 1's worker: the supervisor gives up (its
  restarts 5); the loss event says so and what to do; the client brings
  the island back (restart_worker) and training grows onto it."""
  commit_every = 4
  result = train({"islands": 2, "devices": 2, "steps": 24,
                   "commit_every": commit_every, "rejoin_timeout": 0.5,
                   "worker_timeout": WORKER_TIMEOUT, "restart_delays": [0.0],
                   "faults": [[8, "hammer", 1]], "bring_back": True})
  assert len(result["hurt"]) == 6, result["hurt"]
  events = result["events"]
  assert [(e["kind"], e["islands"]) for e in events] == [
      ("lost", [0]), ("grew", [0, 1])], events
  check_lost(events[0], 1, commit_every)
  assert "island 1: its supervisor gave up" in events[0]["given_up"]
  assert "6 times in a row" in events[0]["given_up"], events[0]
  assert "restart_worker(1)" in events[0]["given_up"], events[0]
  assert result["islands"] == [0, 1]
  _losses_fall(result, 8)


def test_cli_cluster_islands_rejoin_bit_identical():
  with restarting_cluster.started(2, 2, WORKER_TIMEOUT) as cluster:
    result = train(dict(REJOIN, address=cluster.address,
                         token=restarting_cluster.TOKEN))
    assert cluster.restarts == 2
  _check_rejoined(result)


def test_cli_cluster_goes_on_with_fewer_islands():
  with restarting_cluster.started(3, 2, WORKER_TIMEOUT,
                                  restart=False) as cluster:
    result = train(dict(SHRINK, address=cluster.address,
                         token=restarting_cluster.TOKEN))
  _check_shrunk(result)
