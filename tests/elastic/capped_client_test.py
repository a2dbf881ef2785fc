"""Elastic training whose state is larger than the client may hold: its
commits are saved by the islands' workers (issue 52). A test file of its
own: the suite hands out files, and this run is long."""
from __future__ import annotations

import os

import pytest

import restarting_cluster
from runs import WORKER_TIMEOUT, check_lost, train

pytestmark = pytest.mark.integration

# A capped address space counts reservations, mostly untouched: glibc gives
# each new thread an arena of 64 MiB unless told to share two, and a stack
# of `ulimit -s` (8 MiB by default; JAX's proxy client starts threads as
# its work needs them).
CAPPED_ENV = {"MALLOC_ARENA_MAX": "2"}
STACK_KIB = 2048


def test_a_state_beyond_the_clients_memory_commits_and_recovers():
  """640 MiB of the state is made on the devices; the client's address
  space is then capped 448 MiB above what it has (it tries to allocate
  640 MiB, and fails; the rest is room for its threads' stacks): its
  commits are saved by the workers under their storage root, and a killed
  worker's island comes back from the last one, bit-identical. A CLI cluster: the embedded one's workers would be the
  capped process's children, and inherit its cap."""
  commit_every = 4
  with restarting_cluster.started(2, 2, WORKER_TIMEOUT) as cluster:
    result = train({"address": cluster.address,
                    "token": restarting_cluster.TOKEN, "steps": 12,
                    "commit_every": commit_every, "rejoin_timeout": 60.0,
                    "commit_dir": os.path.join(cluster.storage, "commits"),
                    "reference": True, "reference_commit_every": 12,
                    "faults": [[6, "kill", 1]],
                    "ballast_mib": 640, "cap_headroom_mib": 448},
                   env=CAPPED_ENV, stack_kib=STACK_KIB)
    assert cluster.restarts == 1
  assert result["could_hold_state"] is False
  [event] = result["events"]
  check_lost(event, 1, commit_every)
  assert result["ballast_kept"] is True
  assert result["params"] == result["reference"]
