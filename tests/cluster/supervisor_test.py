"""The embedded cluster's supervisor: a worker that keeps dying is restarted
after growing delays, then given up on with a log line; stop() stops every
process ever started."""
import logging
import os
import signal
import time

import pytest

from jax_pathways.cluster import local_cluster
from jax_pathways.cluster.local_cluster import LocalCluster

import processes  # tests/conftest.py puts tests/ on sys.path

pytestmark = pytest.mark.integration


def test_a_worker_that_keeps_dying_is_given_up_on(monkeypatch, caplog):
  monkeypatch.setattr(local_cluster, "RESTART_DELAYS_S", (0.0, 0.2, 0.4))
  monkeypatch.setattr(local_cluster, "MAX_QUICK_RESTARTS", 3)
  cluster = LocalCluster(1, 1, 4)
  cluster.start()
  try:
    first = cluster.workers[0].pid
    # Its restarts die at once (the CLI refuses the command).
    cluster._worker_args[0] = ["no-such-command"]  # pylint: disable=protected-access
    began = time.monotonic()
    with caplog.at_level(logging.WARNING):
      os.kill(first, signal.SIGKILL)
      deadline = time.monotonic() + 60
      while 0 not in cluster._given_up:  # pylint: disable=protected-access
        assert time.monotonic() < deadline, cluster.restarts
        time.sleep(0.05)
    took = time.monotonic() - began
    assert cluster.restarts == [3]
    assert took >= 0.2 + 0.4, took  # the delays were waited
    assert any("not restarting it again: island 0 stays lost" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    started = [p.pid for p in cluster._started]  # pylint: disable=protected-access
    assert len(started) == 1 + 1 + 3  # controller, first worker, restarts
  finally:
    cluster.stop()
  assert not [p for p in started if processes.alive(p)]
