"""A cluster as on real hosts, with the restart policy an orchestrator gives.

The controller and one worker per island from the CLI, everything over
loopback TCP with a token. A policy thread does what Kubernetes'
`restartPolicy: OnFailure` and a liveness probe on `jax-pathways status`
would: it starts a new worker for an island whose worker exited with an
error or a signal, and SIGKILLs a worker that the controller declared lost
while its process still runs (stopped, wedged). Every process it ever
started is stopped by pid at the end.
"""
from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Iterator

from jax_pathways import admin

import cli_cluster
import processes

TOKEN = "elastic-test-token"


class CliCluster:
  """Started by `started()`; `address` and `TOKEN` reach it."""

  def __init__(self, islands: int, devices: int, worker_timeout: float,
               restart: bool):
    self.islands = islands
    self.restart = restart
    self.devices = devices
    self.worker_timeout = worker_timeout
    self.logs = tempfile.mkdtemp(prefix="jp-elastic-")
    # The workers' storage root: where commits may go (commit_dir).
    self.storage = tempfile.mkdtemp(prefix="jp-elastic-storage-")
    self.env = dict(os.environ, JAX_PATHWAYS_TOKEN=TOKEN,
                    JAX_PATHWAYS_STORAGE_ROOT=self.storage)
    for key in ("JAX_PLATFORMS", "XLA_FLAGS", "JAX_NUM_CPU_DEVICES"):
      self.env.pop(key, None)
    self.procs: list[subprocess.Popen] = []
    self.workers: dict[int, subprocess.Popen] = {}
    self.restarts = 0
    self.address = ""
    self._worker_address = ""
    self._stop = threading.Event()
    self._policy_thread: threading.Thread | None = None

  def _spawn(self, name: str, *args: str) -> subprocess.Popen:
    log = (subprocess.PIPE if name == "controller"
           else open(os.path.join(self.logs, f"{name}.log"), "ab"))
    proc = cli_cluster.spawn(*args, env=self.env, stderr=log)
    self.procs.append(proc)
    return proc

  def _worker(self, island: int) -> None:
    self.workers[island] = self._spawn(
        f"worker{island}-{len(self.procs)}", "worker", "--controller",
        self._worker_address, "--island", str(island), "--devices",
        str(self.devices), "--data-listen", "127.0.0.1:0")

  def start(self, timeout: float = 60.0) -> None:
    controller = self._spawn(
        "controller", "controller", "--islands", str(self.islands),
        "--listen", "127.0.0.1:0", "--worker-listen", "127.0.0.1:0",
        "--coordinator-listen", "127.0.0.1:0",
        "--worker-timeout", str(self.worker_timeout))
    deadline = time.monotonic() + timeout
    while not select.select([controller.stdout], [], [], 0.2)[0]:
      if time.monotonic() > deadline or controller.poll() is not None:
        raise AssertionError("the controller did not start")
    ready = json.loads(controller.stdout.readline())
    self.address = "grpc://" + ready["address"]
    self._worker_address = ready["worker_address"]
    for island in range(self.islands):
      self._worker(island)
    while not admin.status(self.address, TOKEN)["complete"]:
      if time.monotonic() > deadline:
        raise AssertionError("the workers did not join")
      time.sleep(0.1)
    if self.restart:
      self._policy_thread = threading.Thread(target=self._policy,
                                             daemon=True)
      self._policy_thread.start()

  def _policy(self) -> None:
    while not self._stop.wait(0.2):
      try:
        islands = admin.status(self.address, TOKEN, timeout=2)["islands"]
      except admin.AdminError:
        continue
      for island in islands:
        proc = self.workers[island["island"]]
        # A new worker shows its pid while it joins, not yet alive.
        if (not island["alive"] and not island["joining"] and
            island["pid"] == proc.pid and proc.poll() is None):
          proc.kill()  # the liveness probe failed
          proc.wait(timeout=10)
        if proc.poll() not in (None, 0):
          self.restarts += 1
          self._worker(island["island"])

  def stop(self) -> None:
    self._stop.set()
    if self._policy_thread is not None:  # it starts no worker after this
      self._policy_thread.join(timeout=15)
    processes.stop(self.procs)
    for proc in self.procs:
      assert not processes.alive(proc.pid), proc.pid


@contextlib.contextmanager
def started(islands: int, devices: int, worker_timeout: float,
            restart: bool = True) -> Iterator[CliCluster]:
  cluster = CliCluster(islands, devices, worker_timeout, restart)
  try:
    cluster.start()
    yield cluster
  finally:
    cluster.stop()
    shutil.rmtree(cluster.storage, ignore_errors=True)
