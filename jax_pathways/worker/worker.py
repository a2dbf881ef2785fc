"""Worker: runs the controller's ops on this island, strictly in gang order.

The C++ Executor hands out ops by sequence number; this loop issues each one
to the PJRT backend without waiting for device data (launches, puts and
copies return futures) and files it with the completion thread, which
reports it once its arrays are ready. Arrays live here, keyed by the buffer
ids the controller chose; a failed op leaves its Status under its result ids,
so later ops fail with the original cause.

Payload headers per op kind (built by the controller's handlers):
  COMPILE  {"devices", "replicas"}, blobs [program, compile options]:
           compiled on the compile pool, beside the op loop and other
           compiles (a program's launches come only after its compile
           was answered); one dropped (DELETE) before it starts is not
  LAUNCH   -                     (program = compiled program id)
  PUT      {"dtype", "shape", "sharding", "strides"?} blobs [bytes]
           or {..., "shards": [{"devices", "dtype", "shape", "strides"?}]}
           with one blob per shard
  FETCH    {"strides"?}
  COPY     {"mode": "reshard" | "shards" (+"positions") | "assemble", ...}
           or {"mode": "remap", "outputs": [{"shape", "sharding",
           "pieces": [[arg, local shard position]]}]}, one per result
  TRACE    {"action": "start" | "stop"}; stop's event: the recorded timings
  SAVE     {"arrays": [{"location", "name", "timeout_s"}]}, one per arg:
           write this island's first replicas of the args' shards
  LOAD     {"arrays": [{"location", "name", "timeout_s", "shape", "dtype",
           "sharding"}]}, one per result: read this island's shards.
           Both run on the storage lane (below), answered once done
  COLOCATED {"action": "call", "client", "function", "pickled", "hello",
           "inputs": [{"sharding", "virtual"}], "outputs": [{"shape",
           "dtype", "sharding", "virtual"}]}, blobs [pickle]: run the
           client's colocated_python function in its process here
           (worker/colocated_processes.py) on this island's shards of the
           args, making this island's shards of the results; on the
           client's lane. {"action": "drop" | "end", "client", "function"}:
           the client let the function go / its session ended (at once)
  JOIN_GLOBAL {"coordinator", "generation", "members"}: build the global
           client of the islands `members` (every island's worker is up,
           an island was lost, or a lost island's place was taken); answered
           once built. Ops after it that need it wait for it (bounded)
  SEND     {"source", "source_islands", "shape", "dtype",
  RECEIVE   "send_to": [{"island", "address"}], "sharding", "pull_from"}:
           one island's part of moving an array between islands; distinct
           piece k of the source travels as transfer + k (the op's
           `program` is the move's transfer id) from the island
           holding it first; see _exchange() and worker/shards.py. With
           "pull_from" (the source island's transfer server) and the same
           pieces on both sides, the receiver pulls it instead
           (worker/transfers.py)
"""
from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import threading
import time
from typing import Any, Callable

from absl import logging
import jax
import numpy as np

from jax_pathways import _core
from jax_pathways import threads
from jax_pathways.status import (Code, Status, StatusError, failed_precondition,
                                 invalid_argument)
from jax_pathways.storage import zarr_arrays
from jax_pathways.wire import payloads
from jax_pathways.worker import shards
from jax_pathways.worker.callback_lanes import Lane, Pending, Task
from jax_pathways.worker.colocated_processes import ColocatedProcesses
from jax_pathways.worker.completions import Completions, error_status
from jax_pathways.worker import host_strings
from jax_pathways.worker.host_strings import HostStrings
from jax_pathways.worker.peers import Peers
from jax_pathways.worker.pjrt_backend import (JOIN_WAIT_S,
                                              SHARDING_CACHE_SIZE, Execution,
                                              PjrtBackend, Program,
                                              host_view, np_dtype)
from jax_pathways.worker.tracer import Tracer
from jax_pathways.worker.transfers import Transfers, arrival

OpKind = _core.OpKind
# How long a RECEIVE waits for its peer's bytes before failing the op.
RECEIVE_TIMEOUT_S = 300.0
# How often a RECEIVE waiting for pushed bytes asks whether their sender
# was lost meanwhile (the notice waits behind the op).
LOSS_POLL_S = 0.1
# Moves the controller lets pull (pipeline steps) do so up to this size;
# larger arrays are pushed: the one-copy path between workers of one host
# has ~6x the bandwidth of the transfer server's (docs/benchmarks.md).
PULL_MAX_BYTES = 1 << 20


STOP_TRACE_WAIT_S = 60.0
# Ops the op loop takes per wake-up (all that have arrived, up to this).
OPS_PER_WAKE = 64
# A fetch of a ready array up to this size is sent by the op loop itself:
# its event fits the socket's buffer, so sending does not wait on the
# controller.
QUICK_FETCH_BYTES = 64 << 10
# Ops that read arrays, which wait on a lane for a lane's results.
_READERS = frozenset({OpKind.LAUNCH, OpKind.FETCH, OpKind.COPY, OpKind.SEND})
# Ops that wait on storage: on a lane of their own (its route), so the op
# loop, and every other client's work on the island, goes on meanwhile.
_STORAGE = frozenset({OpKind.SAVE, OpKind.LOAD})
STORAGE_LANE = -1
# A client's colocated_python calls: on a lane of that client's, below
# STORAGE_LANE, so a function that runs for hours holds nobody else.
_COLOCATED_LANES = -2
# How often a lane waiting for a launch spanning islands looks whether an
# island was lost (the launch then never finishes).
SPANNING_POLL_S = 0.01
# Compiles at once: XLA compiles a program on one core, and the island's
# cores are what bounds them (the op loop never waits for one).
COMPILE_THREADS = max(1, min(4, len(os.sched_getaffinity(0))))


_DONE: concurrent.futures.Future = concurrent.futures.Future()
_DONE.set_result(None)


class Worker:
  """The op loop of one island worker."""

  def __init__(self, executor: Any, backend: PjrtBackend, peers: Peers,
               transfers: Transfers | None = None,
               storage_root: str | None = None,
               colocated: ColocatedProcesses | None = None):
    """`storage_root`: where SAVE and LOAD may reach (storage/paths.py);
    None: nowhere. `colocated`: the clients' colocated Python processes
    here (None: colocated Python is off)."""
    self._executor = executor
    self._storage_root = storage_root
    self._colocated = colocated or ColocatedProcesses(0, enabled=False)
    self._backend = backend
    self._peers = peers
    self._transfers = transfers
    self._programs: dict[int, Program] = {}
    self._compiles = concurrent.futures.ThreadPoolExecutor(
        COMPILE_THREADS, thread_name_prefix="jp-compile")
    # Programs whose compile waits or runs (their futures), and those of
    # them dropped (DELETE) meanwhile.
    self._compiling: dict[int, concurrent.futures.Future] = {}
    self._dropped: set[int] = set()
    # By buffer id: an array (strings: HostStrings), the Status it failed
    # with, or a Pending result of an op on a lane (callback_lanes.py).
    self._buffers: dict[int, jax.Array | HostStrings | Status | Pending] = {}
    # Lanes of programs that call back into their clients, by route; the
    # last launch spanning islands sent to one and the ops on lanes that
    # read a buffer (a later launch must not donate it under them; only
    # the op loop touches these).
    self._lanes: dict[int, Lane] = {}
    self._last_spanning: Task | None = None
    self._lane_readers: dict[int, list[Task]] = {}
    # On a lane's thread: the op's task and the arrays it reads.
    self._on_lane = threading.local()
    # The PUT and exchange headers parsed (payloads.decode): uploads alike,
    # and a pipeline's moves, repeat them.
    self._headers: dict[bytes, Any] = {}
    # id(exchange header) -> (header, how it is pulled or None): _pulled_as.
    self._pull_kinds: dict[int, tuple[dict[str, Any], Any]] = {}
    self._tracer = Tracer()
    # Launches' issue times, and when the island's latest launch ended:
    # how long each held the island, reported for fair sharing (no network
    # in it, as in the controller's own measure).
    self._launched: dict[int, float] = {}
    self._last_launch_end = 0.0
    # Why programs spanning islands fail at once (an island was lost).
    self._spanning_lost: Status | None = None
    self._completions = Completions(self._report, self._stuck,
                                    lambda: self._tracer.enabled)
    self._handlers: dict[Any, Callable[[Any], None]] = {
        OpKind.COMPILE: self._compile,
        OpKind.LAUNCH: self._launch,
        OpKind.PUT: self._put,
        OpKind.FETCH: self._fetch,
        OpKind.DELETE: self._delete,
        OpKind.COPY: self._copy,
        OpKind.SEND: functools.partial(self._exchange, receive=False),
        OpKind.RECEIVE: functools.partial(self._exchange, receive=True),
        OpKind.TRACE: self._trace,
        OpKind.JOIN_GLOBAL: self._join_global,
        OpKind.SAVE: self._save,
        OpKind.LOAD: self._load,
        OpKind.COLOCATED: self._colocated_op,
    }

  def run(self) -> str | None:
    """Runs ops until the controller says stop (returns None) or the
    connection to it ends (returns why)."""
    ended: str | None = None
    try:
      while True:
        for op in self._executor.next_batch(1.0, OPS_PER_WAKE):
          if op.kind == OpKind.SHUTDOWN:
            self._completions.add(op.seq, [])
            return None
          # An op that arrived before the connection ended is not run: the
          # controller has failed it (a lost worker resumed by SIGCONT must
          # not act on what it was sent before its loss).
          ended = self._executor.lost() or None
          if ended:
            return ended
          self._run_op(op)
    except _core.JaxPathwaysError as e:
      ended = str(e)
      return ended
    finally:
      # With no one to report to, work still running (perhaps a program
      # waiting in gloo for a lost island) is not waited for.
      self._colocated.close()
      self._compiles.shutdown(wait=ended is None, cancel_futures=True)
      self._completions.close(wait=ended is None)

  def _run_op(self, op: Any) -> None:
    if op.kind == OpKind.PEER_LOST:
      self._peer_lost(op)
      return
    if op.kind == OpKind.LAUNCH and op.program in self._compiling:
      # Numbered right after its COMPILE (a replacement worker's recompile,
      # compile_cache.py): the launch goes where the program says, so the
      # op loop waits for it here, as it did for every compile before.
      concurrent.futures.wait([self._compiling.get(op.program)
                               or _DONE])
    if (op.kind in _READERS or op.kind in _STORAGE or
        op.kind == OpKind.COLOCATED) and self._to_lane(op):
      return
    record = (self._tracer.issuing(op.seq, op.kind.name.lower(),
                                   self._name(op), op.args, op.results)
              if self._tracer.enabled else None)
    try:
      self._handlers[op.kind](op)
      if record is not None:
        record[4] = time.time_ns()
    except Exception as e:  # pylint: disable=broad-except
      self._failed(op, error_status(e))

  def _failed(self, op: Any, status: Status) -> None:
    task = getattr(self._on_lane, "task", None)
    if task is not None:
      for p in task.results:
        if not p.done:
          p.resolve(status)
    else:
      for b in op.results:
        self._buffers[b] = status
    if op.kind != OpKind.DELETE:  # deletions are never answered
      self._completions.fail(op.seq, status)

  # ------------------------------------------------------------------- lanes
  def _to_lane(self, op: Any) -> bool:
    """Sends `op` to a lane if it calls back into its client or must come
    after an op on a lane (see worker/callback_lanes.py)."""
    program = (self._programs.get(op.program) if op.kind == OpKind.LAUNCH
               else None)
    route = program.callbacks.route if (
        program is not None and program.callbacks is not None) else 0
    if op.kind in _STORAGE:
      route = STORAGE_LANE
    elif op.kind == OpKind.COLOCATED:
      header, _ = payloads.decode(op.payload, self._headers)
      if header["action"] == "end":
        return False  # at once: it kills what the lane may be waiting on
      route = _COLOCATED_LANES - int(header["client"])
    if not route and not self._lanes:
      return False  # no lane ever: nothing is pending (the usual case)
    after: list[Any] = []
    for b in op.args:
      value = self._buffers.get(b)
      if type(value) is Pending:  # pylint: disable=unidiomatic-typecheck
        if value.done:
          self._buffers[b] = value.wait()
        else:
          after.append(value)
    spanning = (program is not None and
                program.client is not self._backend.client)
    if spanning and self._last_spanning is not None:
      if self._last_spanning.issued.is_set():
        self._last_spanning = None
      else:
        after.append(self._last_spanning)
    if program is not None and self._lane_readers:
      for i in program.metadata.get("donated_input_indices", ()):
        if i < len(op.args):
          after += self._unissued_readers(op.args[i])
    if not route and not after:
      return False
    if route:
      lane = self._lanes.get(route)
      if lane is None:
        lane = self._lanes[route] = Lane(
            "jp-storage" if route == STORAGE_LANE else
            f"jp-colocated-{_COLOCATED_LANES - route}" if route < 0 else
            f"jp-lane-{route}")
    else:
      lane = after[0].lane
    snapshot = {b: self._buffers.get(b) for b in op.args}
    task = Task(lambda t: self._run_on_lane(op, t, snapshot, program), after,
                [Pending(lane) for _ in op.results], lane)
    for b, pending in zip(op.results, task.results):
      self._buffers[b] = pending
    for b in op.args:
      self._lane_readers[b] = [*self._unissued_readers(b), task]
    if spanning:
      self._last_spanning = task
    lane.submit(task)
    return True

  def _unissued_readers(self, buffer: int) -> list[Task]:
    """The ops on lanes that read `buffer` and are not issued yet."""
    return [t for t in self._lane_readers.get(buffer, ())
            if not t.issued.is_set()]

  def _run_on_lane(self, op: Any, task: Task, snapshot: dict[int, Any],
                   program: Program | None) -> None:
    """`op` on its lane, with the arrays and the program it named when it
    was ordered (DELETEs ordered after it may have been handled since)."""
    self._on_lane.task, self._on_lane.snapshot = task, snapshot
    self._on_lane.program = program
    try:
      self._handlers[op.kind](op)
    except Exception as e:  # pylint: disable=broad-except
      self._failed(op, error_status(e))
    finally:
      self._on_lane.task = self._on_lane.snapshot = None
      self._on_lane.program = None
      for pending in task.results:  # an op that stored nothing
        if not pending.done:
          pending.resolve(Status(Code.INTERNAL, f"op {op.seq} made no "
                                 "array for this result"))

  def _peer_lost(self, op: Any) -> None:
    """Island `op.program` is lost: programs on the global client wait for
    it in gloo for ever (XLA:CPU's gloo timeout is 30 minutes and nothing
    cancels a launch), so fail them and their arrays now, and every later
    one at once. Work of this island's own client goes on."""
    why = bytes(op.payload).decode(errors="replace")
    status = Status(Code.DATA_LOSS, f"aborted: the program spans islands and "
                    f"{why}")
    logging.error("island %d is lost (%s); failing moves from it and work "
                  "that spans islands", op.program, why)
    # Its moves to ops numbered so far fail; a new worker may take its place.
    self._peers.lost(op.program, op.seq, why)
    if self._transfers:
      self._transfers.cut(op.program)
    if not self._backend.in_global(op.program):
      return  # the global client has gone on without it already
    self._backend.abandon_join(op.program, why)
    self._spanning_lost = status
    for b, value in list(self._buffers.items()):
      if (isinstance(value, jax.Array) and self._backend.spans([value]) and
          not value.is_ready()):
        self._buffers[b] = status
    self._completions.abandon_spanning(status)

  def _join_global(self, op: Any) -> None:
    """Every island's worker builds the next generation of the global
    client (in the background: its own work goes on). Work of the earlier
    one stays failed; a thread stuck in its collectives keeps its spanning
    completion thread, and the new generation gets a new one."""
    header, _ = payloads.decode(op.payload)
    generation = int(header["generation"])
    if not self._backend.spans_islands:
      # Nothing to build: programs spanning islands fail here with why.
      self._completions.add(op.seq, [])
      return
    logging.info("building the islands' global client generation %d at %s",
                 generation, header["coordinator"])
    # An op waiting for it gives up once an island of it is lost (the
    # loss's notice waits behind that op).
    future = self._backend.start_join(header["members"],
                                      header["coordinator"], generation,
                                      self._executor.pending_losses)
    self._spanning_lost = None
    self._completions.restart_spanning()

    def built() -> bytes:
      future.result(timeout=JOIN_WAIT_S)
      return b""

    self._completions.add(op.seq, [], built, spanning=True)

  def _add(self, seq: int, arrays: list[Any], finish: Any = None,
           quick: bool = False) -> None:
    """Completions.add, on the spanning thread for global-client arrays."""
    self._completions.add(seq, arrays, finish,
                          spanning=self._backend.spans(arrays), quick=quick)

  def _report(self, seq: int, status: Status, payload: Any,
              waited: bool) -> None:
    self._tracer.finished(seq, waited)
    issued = self._launched.pop(seq, None)
    held = 0.0
    if issued is not None:
      # The island was this launch's from its issue or the previous
      # launch's end, whichever is later (launches end in order).
      now = time.monotonic()
      held = min(now - max(issued, self._last_launch_end), 86400.0)
      self._last_launch_end = now
    self._executor.complete(seq, int(status.code), status.message, payload,
                            held)

  @staticmethod
  def _stuck(seq: int, seconds: float) -> None:
    """A pulled array never came, and the launches enqueued on it can never
    run: exit, so the controller fails this island's work (and says so)
    instead of every client waiting for ever."""
    logging.error("op %d: the array it pulls from another island did not "
                  "arrive within %.0f s; the worker exits", seq, seconds)
    os._exit(3)  # pylint: disable=protected-access

  def _name(self, op: Any) -> str:
    if op.kind == OpKind.LAUNCH and op.program in self._programs:
      return self._programs[op.program].metadata.get("name", "launch")
    return op.kind.name.lower()

  # ------------------------------------------------------------------ helpers
  def _array(self, buffer: int) -> jax.Array:
    snapshot = getattr(self._on_lane, "snapshot", None)
    value = (snapshot.get(buffer) if snapshot is not None
             else self._buffers.get(buffer))
    if type(value) is Pending:  # pylint: disable=unidiomatic-typecheck
      value = value.wait()  # on a lane: an earlier op's
    if value is None:
      raise StatusError(Code.NOT_FOUND,
                        f"array (buffer {buffer}) is not on this worker: it "
                        "was deleted or never created")
    if isinstance(value, Status):
      raise StatusError(value.code, value.message)
    return value

  def _store(self, op: Any, arrays: list[jax.Array]) -> None:
    if len(arrays) != len(op.results):
      raise StatusError(Code.INTERNAL,
                        f"op produced {len(arrays)} arrays for "
                        f"{len(op.results)} result ids")
    task = getattr(self._on_lane, "task", None)
    if task is not None:
      for pending, a in zip(task.results, arrays):
        pending.resolve(a)
      return
    for b, a in zip(op.results, arrays):
      self._buffers[b] = a

  # ------------------------------------------------------------------ op kinds
  def _compile(self, op: Any) -> None:
    """On the compile pool: a compile of one client (perhaps minutes in
    XLA) holds neither the op loop nor another client's compile."""
    self._compiling[op.program] = self._compiles.submit(self._compile_now, op)

  def _compile_now(self, op: Any) -> None:
    try:
      if op.program in self._dropped:
        raise StatusError(Code.CANCELLED, f"program {op.program} was "
                          "dropped before its compile began: nobody waits "
                          "for it")
      header, (program, options) = payloads.decode(op.payload)
      prog = self._backend.compile(bytes(program), bytes(options),
                                   header["devices"], header["replicas"],
                                   header.get("callbacks"))
    except Exception as e:  # pylint: disable=broad-except
      self._compiling.pop(op.program, None)
      self._dropped.discard(op.program)
      self._failed(op, error_status(e))
      return
    if op.program in self._dropped:  # dropped while it compiled
      self._backend.forget(prog)
    else:
      self._programs[op.program] = prog
    self._compiling.pop(op.program, None)
    self._dropped.discard(op.program)
    metadata = json.dumps(prog.metadata).encode()
    self._completions.add(op.seq, [], lambda: metadata)

  def _launch(self, op: Any) -> None:
    program = (getattr(self._on_lane, "program", None) or
               self._programs.get(op.program))
    if program is None:
      raise failed_precondition(
          f"program {op.program} was not compiled on this worker")
    spanning = program.client is not self._backend.client
    if spanning:
      if program.client is not self._backend.current_global():
        raise failed_precondition(
            f"program {op.program} was compiled for an earlier generation "
            "of the islands' global client, lost with an island's worker")
      lost = self._spanning_lost
      if lost is not None:
        raise StatusError(lost.code, lost.message)
    args = [self._array(b) for b in op.args]
    self._launched[op.seq] = time.monotonic()
    if program.callbacks is not None:  # on its lane
      outputs, execution = self._launch_calling_back(program, args, spanning)
    else:
      outputs, execution = self._backend.execute(program, args)
    self._store(op, outputs)
    self._completions.add(op.seq, [execution], spanning=spanning)

  def _launch_calling_back(self, program: Program, args: list[jax.Array],
                           spanning: bool
                           ) -> tuple[list[jax.Array], Execution]:
    """A launch of a program with callbacks, on its lane: its results
    (and its Execution) are its own once it has finished and none of its
    callbacks failed. `spanning`: the program spans islands."""
    program.callbacks.failure = None
    outputs, execution = self._backend.execute(program, args)
    self._on_lane.task.issued.set()  # a later spanning launch may go now
    if spanning:
      # Never finished if an island is lost meanwhile (see _peer_lost): a
      # thread waits for it, which the lane leaves behind then. (A program
      # without outputs cannot say it is done without a wait.)
      done = threading.Event()
      threads.start(lambda: _wait_quietly(execution, done), "jp-lane-wait")
      while not done.wait(SPANNING_POLL_S) and self._spanning_lost is None:
        pass
    else:
      execution.block_until_ready()
    failure = program.callbacks.take_failure()
    if failure is not None:
      raise StatusError(failure.code, failure.message)
    return outputs, execution

  def _put(self, op: Any) -> None:
    header, blobs = payloads.decode(op.payload, self._headers)
    sharding = self._backend.sharding(header["sharding"])
    strings = header["dtype"] == "string"
    if "shards" not in header:
      host = (host_strings.parse(blobs[0], header["shape"]) if strings else
              host_view(blobs[0], header["dtype"], header["shape"],
                        header.get("strides")))
      if strings:
        index = sharding.devices_indices_map(host.shape)
        array = HostStrings(tuple(host[index[d]]
                                  for d in self._backend.mine(sharding)))
      else:
        array = self._backend.from_host(host, sharding)
    else:
      # This worker's devices only (the controller sends each island its
      # shards of an array that spans islands).
      devices = sharding._device_assignment  # pylint: disable=protected-access
      mine = self._backend.mine(sharding)
      per_device: dict[Any, np.ndarray] = {}
      if len(header["shards"]) != len(blobs):
        raise invalid_argument(
            f"{len(blobs)} blobs for {len(header['shards'])} shards")
      for spec, blob in zip(header["shards"], blobs):
        for index in spec["devices"]:
          if not 0 <= index < len(devices):  # -1 would be a device too
            raise invalid_argument(f"shard device index {index} out of range")
          if devices[index] in mine:
            per_device[devices[index]] = (
                host_strings.parse(blob, spec["shape"]) if strings else
                host_view(blob, spec["dtype"], spec["shape"],
                          spec.get("strides")))
      missing = [d for d in mine if d not in per_device]
      if missing:
        raise invalid_argument(f"no shard given for devices {missing}")
      array = (HostStrings(tuple(per_device[d] for d in mine)) if strings
               else self._backend.from_pieces(
                   header["shape"], sharding, [per_device[d] for d in mine],
                   mine))
    self._store(op, [array])
    self._completions.add(op.seq, [] if strings else [array])

  def _fetch(self, op: Any) -> None:
    header, _ = payloads.decode(op.payload)
    array = self._array(op.args[0])
    if isinstance(array, HostStrings):
      self._completions.add(op.seq, [], array.contents)
      return
    strides = header.get("strides")
    self._add(op.seq, [array], lambda: self._backend.to_host(array, strides),
              quick=array.nbytes <= QUICK_FETCH_BYTES)

  def _delete(self, op: Any) -> None:
    # Only drop the reference: arrays made by copies, shards and assembly can
    # share device buffers, which PJRT frees once nothing uses them.
    # No event: a DELETE is done once ordered (see transport/messages.h).
    for b in op.args:
      self._buffers.pop(b, None)
      self._lane_readers.pop(b, None)
    self._backend.release_host_pieces()
    if op.program:  # a program no launch names again: free its code
      program = self._programs.pop(op.program, None)
      if program is None:
        if op.program in self._compiling:
          self._dropped.add(op.program)
      elif not any(p is program for p in self._programs.values()):
        self._backend.forget(program)

  def _copy(self, op: Any) -> None:
    header, _ = payloads.decode(op.payload)
    mode = header["mode"]
    if mode == "reshard":
      sharding = self._backend.sharding(header["sharding"])
      outputs = [jax.device_put(self._array(b), sharding) for b in op.args]
    elif mode == "shards":  # the local shards at these local positions
      source = self._array(op.args[0])
      if isinstance(source, HostStrings):
        outputs = [source.shard(i) for i in header["positions"]]
        self._store(op, outputs)
        self._completions.add(op.seq, [])
        return
      local = self._backend.shards(source)
      outputs = [local[i] for i in header["positions"]]
    elif mode == "assemble":
      sharding = self._backend.sharding(header["sharding"])
      outputs = [self._backend.assemble(
          header["shape"], sharding, [self._array(b) for b in op.args])]
    elif mode == "remap":  # arrays of the args' local shards, as they are
      local = [self._backend.shards(self._array(b)) for b in op.args]
      outputs = [self._backend.assemble(
          out["shape"], self._backend.sharding(out["sharding"]),
          [local[a][p] for a, p in out["pieces"]])
          for out in header["outputs"]]
    else:
      raise invalid_argument(f"unknown copy mode {mode!r}")
    self._store(op, outputs)
    self._add(op.seq, outputs)

  @staticmethod
  def _described(op: Any, buffers: list[int]) -> list[dict[str, Any]]:
    """What a SAVE or LOAD op's header says of each of its `buffers`."""
    items = payloads.decode(op.payload)[0]["arrays"]
    if len(items) != len(buffers):
      raise invalid_argument(f"{len(items)} arrays described for "
                             f"{len(buffers)} buffers")
    return items

  def _save(self, op: Any) -> None:
    """On the storage lane: writes the args' shards, then reports."""
    for item, b in zip(self._described(op, op.args), op.args):
      zarr_arrays.save(self._array(b), item["location"], item["name"],
                       self._storage_root, float(item["timeout_s"]))
    self._completions.add(op.seq, [])

  def _load(self, op: Any) -> None:
    """On the storage lane: reads this island's shards of the results."""
    outputs = []
    for item in self._described(op, op.results):
      sharding = self._backend.sharding(item["sharding"])
      mine = self._backend.mine(sharding)
      pieces = zarr_arrays.load(item["location"], item["name"],
                                item["shape"], item["dtype"], sharding, mine,
                                self._storage_root, float(item["timeout_s"]))
      outputs.append(self._backend.from_pieces(item["shape"], sharding,
                                               pieces, mine))
    self._store(op, outputs)
    self._completions.add(op.seq, outputs)

  def _colocated_op(self, op: Any) -> None:
    """A client's colocated_python call (on its lane), or its end."""
    header, blobs = payloads.decode(op.payload, self._headers)
    client = int(header["client"])
    if header["action"] == "end":
      self._colocated.end(client)
      self._completions.add(op.seq, [])
      return
    if header["action"] == "drop":
      self._colocated.drop(client, header["function"])
      self._completions.add(op.seq, [])
      return
    inputs = []
    for b, item in zip(op.args, header["inputs"]):
      positions = self._backend.local_positions(item["sharding"]["devices"])
      array = self._array(b)
      shards = (array.shards if isinstance(array, HostStrings) else
                [np.asarray(s) for s in self._backend.shards(array)])
      inputs.append([(item["virtual"][p], shard)
                     for p, shard in zip(positions, shards)])
    shardings, wanted = [], []
    for out in header["outputs"]:
      sharding = self._backend.sharding(out["sharding"])
      shape = sharding.shard_shape(tuple(out["shape"]))
      shardings.append(sharding)
      wanted.append([(out["virtual"][p], shape, out["dtype"]) for p in
                     self._backend.local_positions(out["sharding"]["devices"])])
    made = self._colocated.call(client, header["hello"], header["function"],
                                blobs[0], inputs, wanted)
    outputs = [HostStrings(tuple(pieces)) if out["dtype"] == "string" else
               self._backend.from_pieces(out["shape"], sharding, pieces,
                                         self._backend.mine(sharding))
               for out, sharding, pieces in zip(header["outputs"], shardings,
                                                made)]
    self._store(op, outputs)
    self._completions.add(op.seq, [a for a in outputs
                                   if not isinstance(a, HostStrings)])

  def _trace(self, op: Any) -> None:
    header, _ = payloads.decode(op.payload)
    if header["action"] == "start":
      self._tracer.start()
      self._completions.add(op.seq, [])
    else:  # stop: answered after every earlier op has finished
      sends = self._completions.sends_done()

      def stop() -> bytes:
        sends.wait(STOP_TRACE_WAIT_S)
        return json.dumps(self._tracer.stop()).encode()

      self._completions.add(op.seq, [], stop)

  def _exchange(self, op: Any, receive: bool) -> None:
    """One island's part of moving an array between islands: push the
    distinct pieces it holds first to every destination island, and (if it
    is a destination) build its part of the new array from its own pieces
    and the ones pushed to it."""
    # The same header for every move of a kind: parsed once.
    header, _ = payloads.decode(op.payload, self._headers)
    source_spec, shape = header["source"], header["shape"]
    base = op.program  # the move's transfer id
    source: jax.Array | Status | None = None
    if op.args:
      try:
        source = self._array(op.args[0])
      except StatusError as e:
        source = e.status
    pulled_as = self._pulled_as(header, receive)
    if pulled_as is not None:
      self._pull_exchange(op, pulled_as, min(header["source_islands"]),
                          header["pull_from"], source, receive)
      return
    if header["send_to"]:
      # Not to a worker lost since this op was numbered: its part failed.
      send_to = [d for d in header["send_to"]
                 if self._peers.loss(d["island"], op.seq) is None]
      self._push(source, source_spec, shape, base, send_to,
                 op.seq if not receive else None)
    if not receive:
      return
    pieces: dict[int, np.ndarray] = {}
    if isinstance(source, Status):
      raise StatusError(source.code, source.message)
    if source is not None:
      pieces.update(self._backend.pieces(source, source_spec, shape))
    dtype = np_dtype(header["dtype"])
    src_index = shards.indices(source_spec, shape)
    positions = shards.distinct(src_index)
    for k, pos in enumerate(positions):
      if k in pieces:
        continue
      ref = source_spec["devices"][pos]  # the first device holding piece k
      island = ref[0] if isinstance(ref, list) else header["source_islands"][0]
      data = self._received(op.seq, island, base + k)
      size = [b - a for a, b in src_index[pos]]
      pieces[k] = np.frombuffer(data, dtype).reshape(size)
    by_index = {src_index[pos]: pieces[k] for k, pos in enumerate(positions)}
    sharding = self._backend.sharding(header["sharding"])
    dst_index = shards.indices(header["sharding"], shape)
    devices = sharding._device_assignment  # pylint: disable=protected-access
    mine = self._backend.mine(sharding)
    if all(d in by_index for d in dst_index):  # same layout: no host assembly
      piece_of = dict(zip(devices, dst_index))
      output = self._backend.from_pieces(
          shape, sharding, [by_index[piece_of[d]] for d in mine], mine)
    else:
      output = self._backend.from_host(
          shards.assemble_on_host(shape, dtype, by_index), sharding)
    self._store(op, [output])
    self._completions.add(op.seq, [output])

  def _pulled_as(self, header: dict[str, Any], receive: bool
                 ) -> jax.ShapeDtypeStruct | None:
    """How this worker offers (or, receiving, pulls) a move through the
    transfer servers: the array's shape, dtype and its side's sharding; None
    when the move is pushed. Both workers decide alike from the same header.
    Kept per header object (payloads.decode keeps one per header's bytes): a
    pipeline repeats the same few moves every step."""
    kept = self._pull_kinds.get(id(header))
    if kept is not None and kept[0] is header:  # held: its id is not reused
      return kept[1]
    aval = None
    if header.get("pull_from") and self._transfers:
      size = (int(np.prod(header["shape"])) *
              np_dtype(header["dtype"]).itemsize)
      if (size <= PULL_MAX_BYTES and
          all(isinstance(r, int) for r in header["source"]["devices"]) and
          all(isinstance(r, int) for r in header["sharding"]["devices"]) and
          shards.same_pieces(header["source"], header["sharding"],
                             header["shape"])):
        sharding = self._backend.sharding(
            header["sharding"] if receive else header["source"])
        aval = jax.ShapeDtypeStruct(tuple(header["shape"]),
                                    np_dtype(header["dtype"]),
                                    sharding=sharding)
    if len(self._pull_kinds) >= SHARDING_CACHE_SIZE:
      self._pull_kinds.clear()
    self._pull_kinds[id(header)] = (header, aval)
    return aval

  def _received(self, seq: int, island: int, transfer_id: int) -> np.ndarray:
    """The bytes `island`'s worker pushes to op `seq` as `transfer_id`.
    Waited for in slices: once the worker that op was numbered for is lost
    (its notice handled, or still waiting behind this op) they will never
    come, and the op fails then, not after RECEIVE_TIMEOUT_S with this op
    loop (and every program on this island) held meanwhile."""
    deadline = time.monotonic() + RECEIVE_TIMEOUT_S
    link = None
    while True:
      step = min(LOSS_POLL_S, max(0.0, deadline - time.monotonic()))
      try:
        if link is None:
          link = self._peers.incoming(island, timeout=step)
        return self._peers.links.receive(link, transfer_id, step)
      except TimeoutError:
        if time.monotonic() >= deadline:
          raise TimeoutError(
              f"worker of island {island} did not connect to send data "
              f"within {RECEIVE_TIMEOUT_S:.0f} s") from None
      except _core.JaxPathwaysError as e:
        if e.code != int(Code.DEADLINE_EXCEEDED) or (
            time.monotonic() >= deadline):
          raise
      why = self._lost_source(island, seq)
      if why is not None:
        raise _lost_move(why)

  def _lost_source(self, island: int, seq: int) -> str | None:
    """Why the worker of `island` that op `seq` was numbered for is lost;
    None if it is not (as far as this worker has heard)."""
    why = self._peers.loss(island, seq)
    if why is None:
      why = next((words for lost, upto, words in
                  self._executor.pending_losses()
                  if lost == island and seq <= upto), None)
    return why

  def _pull_exchange(self, op: Any, aval: jax.ShapeDtypeStruct,
                     sender: int, pull_from: str,
                     source: jax.Array | Status | None, receive: bool) -> None:
    """The sender offers the array (or its error) and is done once it is
    ready; the receiver pulls it and goes on at once: the launches after it
    are enqueued before its bytes arrive (worker/transfers.py)."""
    if not receive:
      try:
        self._transfers.offer(op.program, source, aval)
      except Exception as e:  # pylint: disable=broad-except
        # The puller must get something, or it would wait for ever.
        source = error_status(e)
        self._transfers.offer(op.program, source, aval)
      if isinstance(source, Status):
        raise StatusError(source.code, source.message)
      self._completions.add(op.seq, [source])
      return
    # Notices handled only: one still waiting cuts this pull when handled.
    why = self._peers.loss(sender, op.seq)
    if why is not None:  # its server is cut, or gone: the pull would hang
      raise _lost_move(why)
    output = self._transfers.pull(op.program, sender, pull_from, aval)
    landed = arrival(output)
    self._tracer.rename(op.seq, "pull")
    self._store(op, [output])
    self._completions.add(op.seq, landed, deadline_s=RECEIVE_TIMEOUT_S)

  def _push(self, source: jax.Array | Status | None, spec: dict[str, Any],
            shape: list[int], base: int, send_to: list[dict[str, Any]],
            seq: int | None) -> None:
    """Pushes this island's first-held pieces to every destination, bytes or
    the source's error, so no receiver waits for a piece that will not
    come. Runs on the sends thread, after the source is ready, connecting
    there on first use (a stopped peer would hold the op loop in the
    handshake); `seq` (for a send-only op) is reported there."""

    def push() -> bytes:
      links = [self._peers.outgoing(d["island"], d["address"], timeout=30.0)
               for d in send_to]
      failure: Status | None = None
      try:
        if isinstance(source, Status):
          raise StatusError(source.code, source.message)
        mine = self._backend.pieces(source, spec, shape)
      except Exception as e:  # pylint: disable=broad-except
        failure = error_status(e)
        mine = dict.fromkeys(self._backend.first_held(spec, shape))
      for link in links:
        for k, piece in mine.items():
          if failure is None:
            data = np.ascontiguousarray(piece).reshape(-1).view(np.uint8)
            self._peers.links.send(link, base + k, 0, "", data)
          else:
            self._peers.links.send(link, base + k, int(failure.code),
                                   failure.message, b"")
      if failure is not None:
        raise StatusError(failure.code, failure.message)
      return b""

    arrays = [source] if isinstance(source, jax.Array) else []
    self._completions.add_send(seq, arrays, push)


def _wait_quietly(execution: Any, done: threading.Event) -> None:
  """Until `execution` ends, then sets `done` (its error, if any, is
  reported where its arrays are waited for)."""
  try:
    execution.block_until_ready()
  except Exception:  # pylint: disable=broad-except
    pass
  finally:
    done.set()


def _lost_move(why: str) -> StatusError:
  """A move whose sender's worker is lost (`why`: the loss's words), as the
  broken link it is (DATA_LOSS)."""
  return StatusError(Code.DATA_LOSS, f"{_core.BROKEN_LINK} ({why})")
