"""`jax-pathways worker --restart-in-place ...`: the worker as a child of this
process, started again here when it exits with a code a restart can fix.

This is a Kubernetes worker pod's command (deploy/k8s.py). Kubernetes can
restart a container in place (restartPolicy OnFailure) only for every
non-zero exit, and counts those restarts over the pod's whole life; a pod
failure policy, which can tell exit codes apart, needs restartPolicy Never.
So the pod never restarts and this process does, with the embedded
cluster's policy (cluster/restarts.py), keeping the pod's compilation cache
volume and its place:
  0          the worker's controller stopped it or is gone: exit 0
  2          EXIT_SETUP (it cannot start on this host): exit 2 at once; the
             pod failure policy fails the JobSet instead of looping
  any other  (1, EXIT_LOST, a signal): start it again after the incident's
             delay; when the incident is given up on, exit with the
             worker's code and let the Job make a new pod (its backoffLimit
             counts such incidents, not single crashes)
SIGTERM and SIGINT (the pod stopping) go to the worker, and end this
process when the worker ends.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from typing import Any, Sequence

from absl import logging

from jax_pathways.cluster import restarts
from jax_pathways.worker import join

FLAG = "--restart-in-place"
# The worker's command, before its arguments.
WORKER_COMMAND = (sys.executable, "-m", "jax_pathways.cli", "worker")


def _exit_code(returncode: int) -> int:
  """A child's return code as a shell reports it (signal N: 128 + N)."""
  return 128 - returncode if returncode < 0 else returncode


def run(worker_argv: Sequence[str]) -> int:
  """Runs `jax-pathways worker *worker_argv` until it ends for good;
  returns this process's exit code."""
  stopping = threading.Event()
  child: list[subprocess.Popen] = []

  def forward(signum: int, frame: Any) -> None:
    del frame
    stopping.set()
    if child and child[0].poll() is None:
      child[0].send_signal(signum)

  signal.signal(signal.SIGTERM, forward)
  signal.signal(signal.SIGINT, forward)
  incident = restarts.Incident()
  starts = 0
  while True:
    started = time.monotonic()
    child[:] = [subprocess.Popen([*WORKER_COMMAND, *worker_argv],
                                 stdin=subprocess.DEVNULL)]
    starts += 1
    if stopping.is_set():  # the signal came while it was being started
      child[0].terminate()
    code = _exit_code(child[0].wait())
    if stopping.is_set() or code in (0, join.EXIT_SETUP):
      return code
    delay = incident.died(time.monotonic() - started)
    if delay is None:
      logging.error(
          "jax-pathways worker: the worker exited with code %d %s; not "
          "restarting it in place again: exiting with its code so that a "
          "new pod takes its place", code, incident.describe())
      return code
    logging.warning("jax-pathways worker: the worker (pid %d, start %d) "
                    "exited with code %d after %.1f s; starting it again "
                    "in %.0f s", child[0].pid, starts, code,
                    time.monotonic() - started, delay)
    if stopping.wait(delay):
      return code
