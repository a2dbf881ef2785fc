"""Controller: builds the controller's parts and runs them.

    topology  <- WorkerListener (workers join; a lost island's place taken
                 -> the islands build a new global client, coordination.py)
    GrpcService -> Session -> handlers -> programs / Dispatcher -> workers
"""
from __future__ import annotations

import concurrent.futures
import time
from typing import Any

from absl import logging

from jax_pathways import _core
from jax_pathways import _server
from jax_pathways import heap_trim
import jax_pathways
from jax_pathways.cluster import addresses
from jax_pathways.controller.callback_router import CallbackRouter
from jax_pathways.controller.compile_cache import CompileCache
from jax_pathways.controller.coordination import GlobalClient
from jax_pathways.controller.dispatcher import (MEMORY_WAIT_S, WORKER_TIMEOUT_S,
                                                Dispatcher, IslandOp, OpKind)
from jax_pathways.controller.grpc_service import GrpcService
from jax_pathways.controller.handlers.array import STREAM_MIN_BYTES
from jax_pathways.controller.run_bounds import RunBounds
from jax_pathways.controller.session import Services
from jax_pathways.controller.worker_listener import WorkerListener
from jax_pathways.programs import xla_program
from jax_pathways.programs.reader import READERS, ProgramReader
from jax_pathways.resources.resource_manager import ResourceManager
from jax_pathways.resources.topology import Topology
from jax_pathways.validation import SERVER_HANDLES_START
from jax_pathways.wire import payloads


# Compiles being read and placed at once (each waits for a program reader).
COMPILE_THREADS = READERS
# The dispatcher's counters of an island that `jax-pathways status` shows,
# and what it shows before the island has any.
_COUNTERS = {
    "queued": 0, "in_flight": 0, "submitted": 0, "finished": 0,
    "memory_used": 0, "memory_capacity": 0,
    # Uploads are read from the controller's memory (same host).
    "reads_locally": False,
    # Of uploads streamed to the worker while they arrived.
    "staged_bytes": 0,
    # Room a worker on another host holds for stages sent to it and not yet
    # put or ended.
    "held_stage_bytes": 0,
    # Sent, not yet taken by the worker's socket: grows while the worker
    # does not read (frozen), never blocking the controller.
    "send_backlog_bytes": 0,
}


class Controller:
  """One controller: a gRPC port for clients, a port for workers."""

  def __init__(self, islands: int, listen: str = "127.0.0.1:0",
               worker_listen: str = "127.0.0.1:0",
               coordinator_listen: str = "127.0.0.1:0",
               token: str | None = None, max_in_flight: int = 16,
               memory_wait_s: float | None = None,
               reduction_order: str = "rank",
               worker_timeout_s: float | None = None,
               max_program_s: float | None = None):
    """max_program_s: the bound on a program's run time (None: none;
    controller/run_bounds.py)."""
    self.started = time.time()
    # Which islands are lost is the dispatcher's record (it notices);
    # the topology admits a new worker in a lost island's place.
    self.topology = Topology(islands, self._lost_islands)
    self.dispatcher = Dispatcher(
        max_in_flight,
        MEMORY_WAIT_S if memory_wait_s is None else memory_wait_s,
        WORKER_TIMEOUT_S if worker_timeout_s is None else worker_timeout_s)
    # Programs may span islands once the workers share a global client.
    self.global_client = (
        GlobalClient(islands, coordinator_listen, self._islands_up,
                     self._build_global) if islands > 1 else None)
    if self.global_client is not None:
      # The islands build the first generation as soon as all have joined,
      # and after a loss the islands left build one of their own at once,
      # before a client makes arrays spanning them.
      self.topology.when_complete(self.global_client.follow)
      self.dispatcher.on_lost(self.global_client.follow)
    server = _server.GrpcServer()
    self.host_buffers = server.host_buffers
    self.compile_cache = CompileCache(self.dispatcher, self.global_client)
    programs = ProgramReader()
    compiles = concurrent.futures.ThreadPoolExecutor(
        COMPILE_THREADS, thread_name_prefix="jp-compile")
    self.callbacks = CallbackRouter(
        server.send, server.finish,
        lambda module, island: xla_program.check_partition_answer(
            module, self.topology.island(island), programs.read_xla),
        compiles)
    self.services = Services(
        topology=self.topology, dispatcher=self.dispatcher,
        host_buffers=self.host_buffers, compile_cache=self.compile_cache,
        resources=ResourceManager(self.topology, self._lost_islands),
        platform_version=f"jax_pathways {jax_pathways.__version__}",
        global_client=self.global_client,
        callbacks=self.callbacks,
        programs=programs,
        compiles=compiles,
        spmd_across_islands=self.global_client is not None,
        fast_path=(_core.FastPath(self.dispatcher.core, STREAM_MIN_BYTES,
                                  SERVER_HANDLES_START)
                   if self.dispatcher.in_order else None))
    self.run_bounds = RunBounds(
        self.dispatcher, max_program_s,
        lambda: self.service.live_clients(), self.compile_cache.name,
        self.callbacks.calling_back)
    self.service = GrpcService(server, self.services, token, self.status,
                               self.supervised, self.run_bounds.cancel)
    # Island -> its supervisor's last report (admin.report_supervision),
    # and the islands whose error says their supervisor gave up.
    self._supervision: dict[int, dict[str, Any]] = {}
    self._noted: set[int] = set()
    self._listen = listen
    self.address = ""
    self._workers = WorkerListener(
        worker_listen, token, self.topology, self.dispatcher,
        reduction_order, self._island_rejoined, self.callbacks.add_worker)
    self.worker_address = self._workers.address

  def _lost_islands(self) -> set[int]:
    return {s["island"] for s in self.dispatcher.stats() if not s["alive"]}

  def _islands_up(self) -> dict[int, int]:
    """Island -> its worker's generation, for the islands whose worker the
    dispatcher reaches (joined, not lost)."""
    alive = {s["island"] for s in self.dispatcher.stats() if s["alive"]}
    return {int(i.id): i.generation for i in self.topology.islands()
            if i.id in alive}

  def _island_rejoined(self) -> None:
    """A new worker took a lost island's place: the islands up build the
    next generation of the global client now, not at the first program
    spanning islands."""
    if self.global_client is not None:
      self.global_client.follow()

  def _build_global(self, generation: int, address: str,
                    members: tuple[int, ...]) -> None:
    """JOIN_GLOBAL on every member's worker, each at its place in its
    island's order."""
    payload = payloads.encode({"coordinator": address,
                               "generation": generation,
                               "members": list(members)})
    started = time.monotonic()
    logging.info("islands %s build the islands' global client generation %d "
                 "at %s", list(members), generation, address)

    def built(status: Any, _: list[bytes]) -> None:
      self.global_client.finished(generation, status)
      logging.info("global client generation %d: %.3f s after it was "
                   "started", generation, time.monotonic() - started)

    self.dispatcher.submit([IslandOp(i, OpKind.JOIN_GLOBAL, generation,
                                     payload=payload) for i in members],
                           built)

  def start(self) -> None:
    heap_trim.start()  # what a big transfer freed goes back to the system
    self.services.programs.start()
    self._workers.start()
    port = self.service.start(self._listen)
    self.run_bounds.start()
    self.address = (self._listen if addresses.is_unix(self._listen) else
                    f"{self._listen.rsplit(':', 1)[0]}:{port}")
    logging.info("controller serving clients at %s, workers at %s",
                 self.address, self.worker_address)

  def stop(self) -> None:
    self.run_bounds.stop()
    self.service.stop()
    self.callbacks.stop()
    self.services.compiles.shutdown(wait=False, cancel_futures=True)
    self.services.programs.close()
    self._workers.close()
    self.dispatcher.shutdown()
    if self.global_client is not None:
      self.global_client.shutdown()

  def supervised(self, report: dict[str, Any]) -> None:
    """A supervisor's report on an island's worker (admin.py)."""
    island = report["island"]
    if report["given_up"] and not self._supervision.get(
        island, {}).get("given_up"):
      logging.error("island %d: its supervisor gave up restarting its "
                    "worker: %s", island, report["given_up"])
    self._supervision[island] = report
    self._noted.discard(island)
    self._note_give_ups({s["island"]: s for s in self.dispatcher.stats()})

  def _note_give_ups(self, stats: dict[int, dict[str, Any]]) -> None:
    """Every later error of a lost island whose supervisor gave up says
    so (once the controller has seen the island lost; `stats`: the
    dispatcher's, by island)."""
    for island, report in list(self._supervision.items()):
      if (report["given_up"] and island not in self._noted and
          not stats.get(island, {}).get("alive", True)):
        self._noted.add(island)
        self.dispatcher.note_loss(
            island, f"; its supervisor gave up restarting its worker: "
            f"{report['given_up']}")

  def status(self) -> dict[str, Any]:
    """What `jax-pathways status` shows."""
    stats = {s["island"]: s for s in self.dispatcher.stats()}
    self._note_give_ups(stats)  # a loss seen after its give-up was reported
    joining = self.topology.joining()
    # Programs spanning islands run on the workers up that are in the
    # global client's current generation, built.
    spanning = self.global_client is not None
    islands = []
    for island in self.topology.islands():
      s = stats.get(island.id, {})
      islands.append({
          "island": island.id,
          "worker": island.name,
          "pid": island.worker_pid,
          "host": island.worker_host,
          "devices": list(island.device_ids),
          "alive": s.get("alive", False),
          # A new worker is taking the lost island's place: `pid` is already
          # its, `alive` and `error` still the lost worker's.
          "joining": island.id in joining,
          "error": s.get("error", ""),
          # Workers that took a lost worker's place, and the last loss.
          "generation": island.generation,
          "restarts": s.get("restarts", 0),
          "last_lost": s.get("last_lost", ""),
          "last_lost_at": s.get("last_lost_at", 0.0),
          # What its supervisor (the embedded cluster) did, if it reports:
          # processes started, the current one, and a give-up.
          "supervisor": self._supervision.get(island.id),
          # The launch the island runs now (what `jax-pathways cancel`
          # would end, with its client); None: none.
          "running": ({
              "client": s["running_client"],
              "program": self.compile_cache.name(s["running_program"]),
              "seconds": round(s["running_s"], 1),
          } if s.get("running_client") and s.get("alive") else None),
          # Whether programs spanning islands run on this worker now.
          "global_client": (spanning and s.get("alive", False) and
                            self.global_client.member(island)),
          **{k: s.get(k, default) for k, default in _COUNTERS.items()},
      })
    with self.service._lock:  # pylint: disable=protected-access
      sessions = list(self.service.sessions.values())
    shares = self.dispatcher.shares()
    clients = []
    for session in sessions:
      row = session.describe()
      row["device_seconds"] = round(
          shares.get(session.number, {}).get("device_seconds", 0.0), 6)
      clients.append(row)
    return {
        "version": jax_pathways.__version__,
        "uptime_s": round(time.time() - self.started, 1),
        "expected_islands": self.topology.expected_islands,
        "complete": self.topology.complete,
        "max_in_flight": self.dispatcher.max_in_flight,
        "max_program_s": self.run_bounds.max_program_s,
        "islands": islands,
        "clients": clients,
        "live_buffers": self.dispatcher.live_buffers(),
        # Requests answered in C++ (csrc/controller/fast_path/fast_path.h), and those
        # it left to Python.
        "fast_path": (self.services.fast_path.stats()
                      if self.services.fast_path else None),
        # Programs kept compiled now, and compiled since the start.
        "compiled_programs": len(self.compile_cache),
        "compiles": self.compile_cache.compiles,
        # Programs that call back into their clients, and those calls.
        "callbacks": self.callbacks.stats(),
        "global_client": (self.global_client.describe()
                          if self.global_client else None),
        "host_buffer_bytes": self.host_buffers.total_bytes(),
    }
