"""LocalCluster: the embedded cluster initialize() starts when given no address.

One controller process and one worker process per island, talking over Unix
sockets in a private directory, with a fresh random token. The cluster knows every pid and stops them all;
the controller also stops by itself if this process dies, and workers stop
when their controller goes away. Logs go to files under `log_dir`; a failed
start raises with the tail of the log that explains it.

Supervision (`restart_workers`, on by default): a worker that dies (one
that exits cleanly, because its controller went silent or away, is left
gone) is started again with the same arguments, and its new process takes the lost
island's place (its next generation, see resources/topology.py). A worker
the controller has declared lost while its process lives (stopped or
wedged past the controller's --worker-timeout; the supervisor asks the
controller's status about once a second) is SIGKILLed first, so it can
never come back, and then restarted the same way. A worker
that keeps dying soon after it starts is restarted after growing delays and
given up on (cluster/restarts.py): the supervisor tells the controller
(admin.report_supervision, as after every restart), whose `status` shows it
and whose error for the island says so from then on; `restart_worker(i)`
brings such an island back.
"""
from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from absl import logging

from jax_pathways import config
from jax_pathways import threads
from jax_pathways.cluster import cores
from jax_pathways.cluster import restarts
from jax_pathways.cluster import tokens

_STOP_GRACE_S = 5.0
_SUPERVISE_POLL_S = 0.1
# A start slower than this says what it waits for.
_SLOW_START_S = 10.0
# How often the supervisor asks the controller which islands it has lost,
# and for how long at most (a stopped controller must not hold it up).
_LOSS_POLL_S = 1.0
_LOSS_POLL_TIMEOUT_S = 1.0
# A controller silent this long is said to be stopped or stalled (its
# workers leave after 10 s: worker/join.py --controller-timeout).
_SILENT_CONTROLLER_S = 5.0
# The variable that hides all but an island's own accelerators from its
# worker, per platform whose islands can share a host.
VISIBLE_DEVICES = {"cuda": "CUDA_VISIBLE_DEVICES",
                   "rocm": "HIP_VISIBLE_DEVICES"}
# A client's JAX configuration, which the cluster's processes (and Ray's
# actors, deploy/ray_actors.py) must not inherit.
CLIENT_ENV = ("JAX_PLATFORMS", "JAX_BACKEND_TARGET", "XLA_FLAGS",
              "JAX_NUM_CPU_DEVICES")


class ClusterError(RuntimeError):
  """The embedded cluster could not start."""


def _optional(flag: str, value: Any) -> list[str]:
  """`flag` and `value` for a command line; nothing for None (the default)."""
  return [] if value is None else [flag, str(value)]


def _tail(path: str, lines: int = 25) -> str:
  try:
    with open(path, errors="replace") as f:
      return "".join(f.readlines()[-lines:])
  except OSError:
    return ""


def island_env(platform: str, island: int, devices: int) -> dict[str, str]:
  """What island `island`'s worker adds to its environment: on an
  accelerator platform, the variable that shows it only its own `devices`
  devices (island i: the i-th `devices` of those this process may use, all
  of the host's or those the variable already names); nothing for CPU,
  whose devices are emulated per worker. ValueError for an accelerator
  without such a variable on more than one island."""
  if platform == "cpu":
    return {}
  if platform not in VISIBLE_DEVICES:
    if island:
      raise ValueError(
          f"an embedded cluster of {platform} islands has one island (each "
          f"worker takes every {platform} device it sees); start workers "
          f"per host for more (docs/deploy.md, 'By hand')")
    return {}
  variable = VISIBLE_DEVICES[platform]
  first = island * devices
  if os.environ.get(variable):
    given = os.environ[variable].split(",")
    mine = given[first:first + devices]
    if len(mine) < devices:
      raise ValueError(
          f"{variable}={os.environ[variable]} gives this process "
          f"{len(given)} devices: too few for island {island} of "
          f"{devices} devices each")
  else:
    # Too few on the host: the worker says how many it sees.
    mine = [str(d) for d in range(first, first + devices)]
  return {variable: ",".join(mine)}


class LocalCluster:
  """A controller and `islands` workers, as child processes of this one."""

  def __init__(self, islands: int, devices_per_island: int,
               max_in_flight: int, log_dir: str | None = None,
               start_timeout: float = config.DEFAULT_START_TIMEOUT,
               memory_wait_s: float | None = None,
               reduction_order: str = "rank",
               device_cores: list[list[int]] | None = None,
               tcp: bool = False, worker_timeout_s: float | None = None,
               restart_workers: bool = True, workers_over_tcp: bool = False,
               platform: str = "cpu", compilation_cache_dir: str | None = None,
               controller_timeout_s: float | None = None,
               storage_root: str | None = None,
               colocated_python: bool = False,
               max_program_s: float | None = None):
    if device_cores is not None and len(device_cores) != islands:
      raise ValueError(f"device_cores names {len(device_cores)} islands' "
                       f"cores for {islands} islands")
    self._worker_env = [island_env(platform, i, devices_per_island)
                        for i in range(islands)]
    if device_cores is not None and platform != "cpu":
      raise ValueError(f"device_cores pins emulated CPU devices; the "
                       f"{platform} islands' devices are their own")
    self.platform = platform
    self.compilation_cache_dir = compilation_cache_dir
    self.storage_root = storage_root
    self.colocated_python = colocated_python
    # The workers' --controller-timeout (None: their default).
    self.controller_timeout_s = controller_timeout_s
    self.islands = islands
    self.device_cores = device_cores
    self.devices_per_island = devices_per_island
    self.max_in_flight = max_in_flight
    self.memory_wait_s = memory_wait_s
    self.worker_timeout_s = worker_timeout_s
    # The controller's --max-program-seconds (None: its default, which
    # JAX_PATHWAYS_MAX_PROGRAM_SECONDS sets).
    self.max_program_s = max_program_s
    self.reduction_order = reduction_order
    self.tcp = tcp  # clients connect over loopback TCP, not a Unix socket
    # Workers too, as from other hosts: uploads are sent to them, not read
    # out of the controller's memory (benchmarks of that path).
    self.workers_over_tcp = workers_over_tcp
    self.token = tokens.new()
    # Sockets live in a directory only this user can enter (mode 0700).
    self.socket_dir = tempfile.mkdtemp(prefix="jax_pathways_")
    self.log_dir = log_dir or self.socket_dir
    self.start_timeout = start_timeout
    self.controller: subprocess.Popen | None = None
    self.workers: list[subprocess.Popen] = []  # island i's current worker
    self.restart_workers = restart_workers
    # Every process ever started (stop() stops them all, by pid).
    self._started: list[subprocess.Popen] = []
    self._worker_args: list[list[str]] = []
    self.restarts = [0] * islands  # per island
    self._incidents = [restarts.Incident() for _ in range(islands)]
    self._given_up: dict[int, str] = {}  # island -> why
    self._supervisor: threading.Thread | None = None
    self._controller_gone = threading.Event()
    self._restart_lock = threading.Lock()
    self.controller_address = ""
    self._logs: dict[int, str] = {}
    self._stopping = threading.Event()
    self._watcher: threading.Thread | None = None
    self._report_lock = threading.Lock()
    self._reported = False

  @property
  def address(self) -> str:
    return f"grpc://{self.controller_address}"

  @property
  def pids(self) -> list[int]:
    procs = ([self.controller] if self.controller else []) + self.workers
    return [p.pid for p in procs]

  def _spawn(self, name: str, args: list[str],
             env_extra: dict[str, str] | None = None) -> subprocess.Popen:
    os.makedirs(self.log_dir, exist_ok=True)
    log_path = os.path.join(self.log_dir, f"{name}.log")
    env = dict(os.environ)
    env[config.TOKEN] = self.token
    for key in CLIENT_ENV:
      env.pop(key, None)
    env.update(env_extra or {})
    with open(log_path, "ab") as log:
      proc = subprocess.Popen(
          [sys.executable, "-m", "jax_pathways.cli", *args],
          # The controller's stdout carries its ready line and shows its
          # death; a worker's goes to its log (a pipe nobody reads would
          # block the worker once full).
          stdin=subprocess.DEVNULL,
          stdout=subprocess.PIPE if name == "controller" else log,
          stderr=log,
          # Not the caller's directory: `-m` would import a source checkout
          # found there (without its compiled core) instead of the install.
          cwd=self.log_dir, env=env, start_new_session=True)
    self._logs[proc.pid] = log_path
    self._started.append(proc)
    return proc

  def _spawn_worker(self, island: int) -> subprocess.Popen:
    return self._spawn(f"worker{island}", self._worker_args[island],
                       self._worker_env[island])

  def start(self) -> None:
    deadline = time.monotonic() + self.start_timeout
    try:
      sockets = self.socket_dir
      self.controller = self._spawn("controller", [
          "controller", "--islands", str(self.islands),
          "--listen",
          "127.0.0.1:0" if self.tcp else f"unix:{sockets}/clients.sock",
          "--worker-listen", "127.0.0.1:0" if self.workers_over_tcp
          else f"unix:{sockets}/workers.sock",
          "--coordinator-listen", f"unix:{sockets}/coordination.sock",
          "--max-in-flight", str(self.max_in_flight),
          "--reduction-order", self.reduction_order,
          "--parent-pid", str(os.getpid()),
          *_optional("--memory-wait", self.memory_wait_s),
          *_optional("--worker-timeout", self.worker_timeout_s),
          *_optional("--max-program-seconds", self.max_program_s)])
      ready = self._read_ready_line(self.controller, deadline)
      self.controller_address = ready["address"]
      for i in range(self.islands):
        self._worker_args.append([
            "worker", "--controller", ready["worker_address"],
            "--island", str(i), "--devices", str(self.devices_per_island),
            # Emulated CPU devices unless told, also on a host with
            # accelerators.
            "--platform", self.platform,
            "--data-listen", f"unix:{sockets}/data{i}.sock",
            *_optional("--device-cores", None if self.device_cores is None
                       else cores.format_list(self.device_cores[i])),
            *_optional("--compilation-cache-dir",
                       self.compilation_cache_dir),
            *_optional("--storage-root", self.storage_root),
            *(("--colocated-python",) if self.colocated_python else ()),
            *_optional("--controller-timeout", self.controller_timeout_s)])
        self.workers.append(self._spawn_worker(i))
      self._wait_complete(deadline)
    except BaseException:
      self.stop()
      raise
    logging.info("jax_pathways local cluster: %d islands x %d devices at %s "
                 "(pids %s, logs in %s%s)", self.islands,
                 self.devices_per_island, self.address, self.pids,
                 self.log_dir,
                 f"; island cores {self.device_cores}"
                 if self.device_cores else "")
    self._watcher = threads.start(self._watch, "jax-pathways-watch",
                                  self.controller)
    if self.restart_workers:
      self._supervisor = threads.start(self._supervise,
                                       "jax-pathways-supervise")

  def _watch(self, controller: subprocess.Popen) -> None:
    while not self._stopping.is_set():
      if self._report_if_dead(controller, wait_s=0.1):
        self._controller_gone.set()
        return

  def _supervise(self) -> None:
    """Starts a dead worker again (the only thread polling workers until
    stop()): when cluster/restarts.py says. A worker
    the controller has declared lost is killed first (_kill_lost)."""
    started = [time.monotonic()] * self.islands
    due: dict[int, float] = {}  # island -> when to start its worker
    # Islands whose worker left its silent controller: started again once
    # the controller answers.
    awaiting: set[int] = set()
    next_loss_poll = time.monotonic() + _LOSS_POLL_S
    answered_at = time.monotonic()
    while not self._stopping.wait(_SUPERVISE_POLL_S):
      if self._controller_gone.is_set():
        return  # workers end with their controller; nothing to rejoin
      now = time.monotonic()
      if now >= next_loss_poll:
        if self._kill_lost():
          answered_at = now
          for i in awaiting:
            logging.warning("jax_pathways local cluster: the controller "
                            "answers again; starting island %d's worker", i)
            due[i] = now
          awaiting.clear()
        elif now - answered_at > _SILENT_CONTROLLER_S:
          logging.log_every_n_seconds(
              logging.ERROR, "jax_pathways local cluster: the controller "
              "(pid %d) has not answered for %.0f s: stopped or stalled. "
              "Calls wait until it answers again, or fail after "
              "JAX_PATHWAYS_CONTROLLER_TIMEOUT (60 s); its workers leave "
              "after their --controller-timeout of silence and are started "
              "again once it does.", 60,
              self.controller.pid, now - answered_at)
        next_loss_poll = time.monotonic() + _LOSS_POLL_S
      for i, worker in enumerate(self.workers):
        if (i in self._given_up or i in due or i in awaiting or
            worker.poll() is None):
          continue
        lived = now - started[i]
        if worker.returncode == 0:
          # It left on purpose: its controller fell silent (stopped or
          # stalled: _controller_gone is set if it died), or told it to
          # stop (then it is stopping too). A new worker could not join it
          # before it answers again.
          logging.warning(
              "jax_pathways local cluster: the worker of island %d (pid %d) "
              "left after %.1f s (its controller stopped answering, or "
              "stopped it); starting it again once the controller answers",
              i, worker.pid, lived)
          awaiting.add(i)
          continue
        delay = self._incidents[i].died(lived)
        if delay is None:
          why = (f"it exited with code {worker.returncode} (pid "
                 f"{worker.pid}) {self._incidents[i].describe()} (its log: "
                 f"{self._logs.get(worker.pid, '')}); fix the cause, then "
                 f"call jax_pathways.local_cluster().restart_worker({i}), "
                 "or start the program again")
          logging.error("jax_pathways local cluster: not restarting island "
                        "%d's worker again: %s", i, why)
          self._given_up[i] = why
          self._report(i)
          continue
        logging.warning(
            "jax_pathways local cluster: the worker of island %d (pid %d) "
            "exited with code %s after %.1f s; restarting it in %.0f s",
            i, worker.pid, worker.returncode, lived, delay)
        due[i] = now + delay
      for i, when in list(due.items()):
        if when > now:
          continue
        del due[i]
        with self._restart_lock:  # stop() sees every process started
          if self._stopping.is_set():
            return
          self.workers[i] = self._spawn_worker(i)
        self.restarts[i] += 1
        started[i] = time.monotonic()
        logging.warning("jax_pathways local cluster: island %d's worker "
                        "started again (pid %d, restart %d)", i,
                        self.workers[i].pid, self.restarts[i])
        self._report(i)

  def restart_worker(self, island: int) -> None:
    """Starts island `island`'s worker again: one the supervisor gave up on
    (its cause fixed), or one that left; the new worker takes the island's
    place as any restarted one (and `elastic.run` grows onto it at its next
    commit). Raises ValueError while its worker runs."""
    with self._restart_lock:
      if self._stopping.is_set() or self.controller is None:
        raise ValueError("the cluster is stopped")
      worker = self.workers[island]
      if worker.poll() is None:
        raise ValueError(f"island {island}'s worker (pid {worker.pid}) is "
                         "running")
      self._given_up.pop(island, None)
      self._incidents[island].reset()
      self.workers[island] = self._spawn_worker(island)
      self.restarts[island] += 1
    logging.warning("jax_pathways local cluster: island %d's worker started "
                    "again on request (pid %d, restart %d)", island,
                    self.workers[island].pid, self.restarts[island])
    self._report(island)

  def _report(self, island: int) -> None:
    """Tells the controller what this supervisor did to `island`'s worker
    (its `status` and its error for the island show it)."""
    from jax_pathways import admin  # pylint: disable=import-outside-toplevel
    try:
      admin.report_supervision(
          self.address, {"island": island, "pid": self.workers[island].pid,
                         "restarts": self.restarts[island],
                         "given_up": self._given_up.get(island, "")},
          self.token, timeout=_LOSS_POLL_TIMEOUT_S)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("jax_pathways local cluster: could not tell the "
                      "controller about island %d's worker: %s", island, e)

  def _kill_lost(self) -> bool:
    """SIGKILLs each worker the controller has declared lost (silent past its
    --worker-timeout: stopped or wedged) while its process lives: stopped,
    it never exits, so its island would stay lost; resumed, it must not
    touch shared state. _supervise then restarts it as any dead worker.
    Returns whether the controller answered."""
    from jax_pathways import admin  # pylint: disable=import-outside-toplevel
    try:
      islands = admin.status(self.address, self.token,
                             timeout=_LOSS_POLL_TIMEOUT_S)["islands"]
    except Exception as e:  # pylint: disable=broad-except
      logging.log_every_n_seconds(
          logging.WARNING, "jax_pathways local cluster: could not ask the "
          "controller which workers it lost: %s", 60, e)
      return False
    if self._stopping.is_set():  # stop() is taking the workers
      return True
    for island in islands:
      if island["alive"] or island["joining"]:
        continue
      i = island["island"]
      worker = self.workers[i]
      # The pid tells the lost worker from one already started in its place
      # (and not yet registered: "joining" covers it once it is).
      if island["pid"] != worker.pid or worker.poll() is not None:
        continue
      logging.warning(
          "jax_pathways local cluster: the controller declared the worker of "
          "island %d (pid %d) lost, but its process lives (stopped or "
          "wedged): killing it (%s)", i, worker.pid, island["last_lost"])
      worker.kill()
    return True

  def _report_if_dead(self, controller: subprocess.Popen | None,
                      wait_s: float = 0.0) -> bool:
    """Says so, loudly, when the controller died under a running program:
    JAX's own error then only reads UNAVAILABLE. The controller's stdout
    reaches EOF the moment it dies (before it can be reaped), as fast as the
    client's sockets notice."""
    if controller is None or controller.stdout is None:
      return False
    readable, _, _ = select.select([controller.stdout], [], [], wait_s)
    if not readable or os.read(controller.stdout.fileno(), 4096):
      return False
    try:
      code: int | str = controller.wait(timeout=2)
    except subprocess.TimeoutExpired:
      code = "unknown (it closed its output)"
    log = self._logs.get(controller.pid, "")
    # Printed under the lock, so whoever returns True knows it was printed
    # (at exit the daemon watcher may be cut off mid-way).
    with self._report_lock:
      if not self._reported:
        print(f"jax_pathways: the controller (pid {controller.pid}) exited "
              f"with code {code}; every pending and later JAX call fails. Its "
              f"log ({log}) ends with:\n{_tail(log, 10)}", file=sys.stderr,
              flush=True)
        self._reported = True
    return True

  def _read_ready_line(self, proc: subprocess.Popen, deadline: float
                       ) -> dict[str, Any]:
    assert proc.stdout is not None
    while time.monotonic() < deadline:
      ready, _, _ = select.select([proc.stdout], [], [], 0.2)
      if ready:
        line = proc.stdout.readline()
        if line:
          return json.loads(line)
      if proc.poll() is not None:
        raise self._died(proc, "controller")
    log = self._logs[proc.pid]
    raise ClusterError(
        f"the controller did not start within {self.start_timeout:.0f} s; "
        f"its log ({log}) ends with:\n{_tail(log)}")

  def _wait_complete(self, deadline: float) -> None:
    from jax_pathways import admin  # pylint: disable=import-outside-toplevel
    say_at = time.monotonic() + _SLOW_START_S
    while time.monotonic() < deadline:
      for i, w in enumerate(self.workers):
        if w.poll() is not None:
          raise self._died(w, f"worker of island {i}")
      if self.controller.poll() is not None:
        raise self._died(self.controller, "controller")
      try:
        status = admin.status(self.address, self.token, timeout=2.0)
        if status["complete"]:
          return
        joined = len(status["islands"])
      except admin.AdminError:
        joined = 0
      if time.monotonic() > say_at:  # a slow start says what it waits for
        say_at = float("inf")
        logging.warning("jax_pathways local cluster: waiting for the "
                        "workers to join the controller (%d of %d so far, "
                        "up to %.0f s in all; logs in %s)", joined,
                        self.islands, self.start_timeout, self.log_dir)
      time.sleep(0.05)
    raise ClusterError(
        f"the workers did not all join within {self.start_timeout:.0f} s; "
        f"logs are in {self.log_dir}")

  def _died(self, proc: subprocess.Popen, what: str) -> ClusterError:
    path = self._logs.get(proc.pid, "")
    return ClusterError(
        f"the {what} (pid {proc.pid}) exited with code {proc.returncode} "
        f"while starting; its log ({path}) ends with:\n{_tail(path)}")

  def drain(self) -> None:
    """Asks the controller to stop once this process's session has closed
    (at interpreter exit, before JAX's client is torn down); the workers
    follow their controller. Does not wait."""
    self._stop_watching()
    if self._report_if_dead(self.controller):
      return
    if self.controller is not None:
      self.controller.send_signal(signal.SIGUSR1)
    # Its processes end after this one; their sockets and logs are not
    # needed unless something failed (removed files stay usable).
    self._clean_up(self._failed())

  def _failed(self) -> bool:
    """Whether anything went wrong that the logs may explain: a worker
    restarted or given up on, a process that exited other than with 0."""
    return (any(self.restarts) or bool(self._given_up) or
            any(p.poll() not in (None, 0) for p in self._started))

  def _clean_up(self, failed: bool) -> None:
    """Removes the folder this cluster made (sockets, and logs unless
    log_dir was given), keeping logs and saying where after a failure."""
    if self.socket_dir == self.log_dir and failed:
      for name in os.listdir(self.socket_dir):
        if name.endswith(".sock"):
          os.unlink(os.path.join(self.socket_dir, name))
      logging.warning("jax_pathways local cluster: something failed in this "
                      "run (restarts %s); its logs are kept in %s",
                      self.restarts, self.log_dir)
    else:
      shutil.rmtree(self.socket_dir, ignore_errors=True)

  def _stop_watching(self) -> None:
    # Popen.poll() from two threads can return None for a dead child (the
    # other holds the wait lock), so only one thread polls at a time.
    with self._restart_lock:
      self._stopping.set()
    if self._watcher is not None:
      self._watcher.join(timeout=2)
    if self._supervisor is not None:
      self._supervisor.join(timeout=2)

  def stop(self) -> None:
    """Stops every process this cluster started; idempotent."""
    self._stop_watching()
    failed = self._failed()  # before SIGTERM gives them other exit codes
    # Every process ever started: workers restarted under supervision too.
    procs = list(self._started)
    for p in procs:
      if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
          p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + _STOP_GRACE_S
    for p in procs:
      try:
        p.wait(timeout=max(0.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        p.kill()
        p.wait(timeout=5)
      if p.stdout is not None:
        p.stdout.close()
    if os.path.isdir(self.socket_dir):  # not yet cleaned up by drain()
      self._clean_up(failed)
    self.controller = None
    self.workers = []
    self._started = []
