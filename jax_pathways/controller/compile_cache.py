"""CompileCache: compile each placed program once, whoever asks for it.

Programs are keyed by their bytes, options and devices. The first request
sends a COMPILE op to the worker of each island the program runs on (one
gang); later ones (a re-jit, another client) reuse the result or wait for
the compile already running. Failures are not cached, so a retry compiles
again.

Every executable given out holds its program until released (the client
destroys it, or its session ends). A program nobody holds is kept for a
while (the KEEP_UNHELD released last, for a quick re-jit), then freed on
the controller and on its workers: a DELETE naming it, ordered after its
launches, frees its compiled code (each XLA:CPU program holds memory
mappings, of which a process has 65,530). A program with callbacks is
its client's alone, so it is freed as soon as it is released.

When a lost island's place is taken by a new worker (its next generation),
the programs compiled for the old one are compiled again on the new one
when they are next launched: a COMPILE op ahead of the LAUNCH in the
island's order, so neither the client nor the launch waits for it. Programs
spanning islands run on the islands' global client, which is rebuilt over
the islands up (its next generation, controller/coordination.py) when they
change: after a loss, for the islands left; after a rejoin, with the new
worker. They are compiled again, on all their islands, for the generation
they next launch on; one spanning a lost island fails with its loss.
"""
from __future__ import annotations

import collections
import itertools
import json
import threading
from typing import Any, Callable, Sequence

from jax_pathways.controller.arrays import Array, island_bytes
from jax_pathways.controller.coordination import GlobalClient
from jax_pathways.controller.dispatcher import (Dispatcher, IslandOp, OnDone,
                                                OpKind)
from jax_pathways.controller.gangs import (ARG, RESULT, Ref, Schedule,
                                           StepOp)
from jax_pathways.controller.launch_context import LaunchContext
from jax_pathways.programs import sharding as sharding_lib
from jax_pathways.programs.xla_program import PlacedProgram
from jax_pathways.resources.island import Island
from jax_pathways.resources.topology import Topology
from jax_pathways.status import Code, Status, StatusError, invalid_argument
from jax_pathways.wire import payloads



class CompiledProgram:
  """A program compiled on its island's worker, with its metadata.

  Everything Execute needs is computed once here: it runs on every call.
  """

  def __init__(self, program_id: int, islands: tuple[Island, ...],
               devices: tuple[int, ...], metadata: dict[str, Any],
               compile_payload: Any, global_generation: int | None,
               key: str, route: int):
    self.program_id = program_id
    # Its compile cache key, and the route of its callbacks (0: none;
    # controller/callback_router.py): a program with a route is its
    # client's.
    self.key = key
    self.route = route
    # Launches of a program with callbacks not finished yet, and what runs
    # once none is (its route's release: a call may still come until then).
    self._in_flight = 0
    self._when_idle: Callable[[], None] | None = None
    # The COMPILE op's payload, sent again to an island's next worker.
    self._compile_payload = compile_payload
    # The global client's generation a program spanning islands was
    # compiled for (None: one island).
    self._global_generation = global_generation
    self._lock = threading.Lock()
    self.islands = islands
    self.devices = devices
    self.metadata = metadata
    self.outputs: list[tuple[tuple[int, ...], str]] = [
        (tuple(o["shape"]), o["dtype"]) for o in metadata["outputs"]]
    self.donated: tuple[int, ...] = tuple(metadata["donated_input_indices"])
    ops = metadata["output_shardings"]
    kinds = (metadata["output_memory_kinds"] or [[]])[0]
    self.output_shardings: list[sharding_lib.Sharding] = [
        sharding_lib.from_op_sharding(
            devices, None if ops is None else ops[i],
            kinds[i] if i < len(kinds) else None)
        for i in range(len(self.outputs))]
    params = metadata.get("parameter_shardings")
    self.parameter_shardings: list[sharding_lib.Sharding] | None = (
        None if params is None else
        [sharding_lib.from_op_sharding(devices, p, None) for p in params])
    self.output_islands = [islands] * len(self.outputs)
    # (shape, dtype) of each parameter; None where the worker could not say.
    self.parameters: list[tuple[tuple[int, ...], str] | None] = [
        None if p is None else (tuple(p["shape"]), p["dtype"])
        for p in metadata["parameters"]]
    self.num_parameters = len(self.parameters)
    self._device_set = frozenset(devices)
    shardings = self.parameter_shardings or []
    self._argument_shardings: list[sharding_lib.Sharding | None] = (
        list(shardings) if len(shardings) == self.num_parameters
        else [None] * self.num_parameters)
    self._output_bytes: dict[int, list[int]] | None = None
    self._schedule: Schedule | None = None

  def ensure_current(self, context: LaunchContext) -> None:
    """Makes the program runnable on its islands' current workers: compiles
    it on a worker that took a lost one's place, and a program spanning
    islands on all of them once the global client has a new generation (a
    COMPILE op numbered ahead of whatever is launched next, so nobody
    waits). Raises why a program spanning islands cannot run (see
    GlobalClient.check). An island that is lost and not back yet is left
    alone: launches fail there with the loss."""
    topology = context.topology
    with self._lock:
      current = tuple(topology.island(i.id) for i in self.islands)
      if self._global_generation is None:
        stale = [c for c, old in zip(current, self.islands)
                 if c.generation != old.generation]
      else:
        generation = context.global_client.check(current)
        if generation is None:  # an island is lost: launches fail there
          return
        stale = (list(current) if generation != self._global_generation
                 else [])
        self._global_generation = generation
      if not stale:
        return
      context.dispatcher.submit(
          [IslandOp(c.id, OpKind.COMPILE, self.program_id,
                    payload=self._compile_payload) for c in stale])
      self.islands = current
      self.output_islands = [current] * len(self.outputs)

  def programs(self) -> list[CompiledProgram]:
    """What its executable holds of the CompileCache (MpmdExecutable's
    twin)."""
    return [self]

  def check_argument(self, i: int, array: Array) -> None:
    # By id: an array of an island's older generation is failed already
    # (DATA_LOSS naming its worker), which is what its user should read.
    if [x.id for x in array.islands] != [x.id for x in self.islands]:
      raise invalid_argument(
          f"argument {i} lives on islands {[x.id for x in array.islands]} "
          f"but the program runs on islands {[x.id for x in self.islands]}; "
          "move it with jax.device_put first")
    array.check_fits(i, self._device_set, self.parameters[i],
                     self._argument_shardings[i])

  def launch(self, context: LaunchContext, args: Sequence[Array],
             results: Sequence[int], on_done: OnDone | None) -> None:
    """One LAUNCH gang over the program's islands: `args` -> `results`."""
    self.ensure_current(context)
    if self.route:
      on_done = self._counted(on_done)
    try:
      self.schedule(context).run(context, [a.buffer for a in args],
                                 list(results), on_done)
    except BaseException:
      if self.route:
        on_done(Status(Code.INTERNAL, "not launched"), [])
      raise

  def _counted(self, on_done: OnDone | None) -> OnDone:
    """`on_done`, counting the launch in flight until it runs."""
    with self._lock:
      self._in_flight += 1

    def done(status: Status, *rest: Any) -> None:
      with self._lock:
        self._in_flight -= 1
        idle = self._when_idle if self._in_flight == 0 else None
        if idle is not None:
          self._when_idle = None
      if idle is not None:
        idle()
      if on_done is not None:
        on_done(status, *rest)

    return done

  def when_idle(self, run: Callable[[], None]) -> None:
    """Runs `run` once no launch of this program is in flight (now if
    none is)."""
    with self._lock:
      if self._in_flight:
        self._when_idle = run
        return
    run()

  def schedule(self, context: LaunchContext,
               args: Sequence[Array] = ()) -> Schedule:
    """A launch as plain data (the same for any arguments it takes)."""
    del args
    if self._schedule is None:
      self._schedule = Schedule(
          [self.launch_ops([(ARG, i) for i in range(self.num_parameters)],
                           [(RESULT, j) for j in range(len(self.outputs))],
                           context.topology)], done=0)
    return self._schedule

  def launch_ops(self, args: Sequence[Ref], results: Sequence[Ref],
                 topology: Topology) -> list[StepOp]:
    """The LAUNCH gang over the program's islands, buffers by role."""
    sizes = self.output_bytes(topology)
    return [StepOp(island.id, OpKind.LAUNCH, self.program_id, tuple(args),
                   tuple(results), result_bytes=tuple(sizes[island.id]))
            for island in self.islands]

  def output_bytes(self, topology: Topology) -> dict[int, list[int]]:
    """Island -> the device memory of each output there."""
    if self._output_bytes is None:
      per_output = [island_bytes(dtype, shape, sharding, topology)
                    for (shape, dtype), sharding in zip(self.outputs,
                                                         self.output_shardings)]
      self._output_bytes = {island.id: [b.get(island.id, 0)
                                        for b in per_output]
                            for island in self.islands}
    return self._output_bytes


OnCompiled = Callable[[Status, "CompiledProgram | None"], None]

# Programs kept after their last holder released them (a re-jit of one
# reuses it). Small: each keeps its compiled code on every worker.
KEEP_UNHELD = 16


class CompileCache:
  """Thread-safe; one per controller. Each program given to an OnCompiled
  is held once for it: release() it when its executable goes."""

  def __init__(self, dispatcher: Dispatcher,
               global_client: GlobalClient | None = None):
    self._dispatcher = dispatcher
    self._global_client = global_client
    self._ids = itertools.count(1)
    self._lock = threading.Lock()
    self.compiles = 0  # programs sent to be compiled, ever
    self._done: dict[str, CompiledProgram] = {}
    # Compiles under way: key -> (program id, its islands, [(client,
    # waiter)]). A compile every waiter of which left is dropped
    # (abandon()).
    self._waiting: dict[str, tuple[int, tuple[Island, ...],
                                   list[tuple[int, OnCompiled]]]] = {}
    self._holders: dict[str, int] = {}  # by key, of the programs in _done
    self._fences: dict[str, int] = {}  # releases whose fence is not numbered
    # Programs in _done that nobody holds, least recently released first.
    self._unheld: collections.OrderedDict[str, CompiledProgram] = (
        collections.OrderedDict())

  def compile(self, program: PlacedProgram, on_done: OnCompiled,
              client: int = 0) -> None:
    """Compiles `program` once on its islands for every `client` waiting
    for it (abandon() drops a client's waits)."""
    generation = None
    if len(program.islands) > 1:
      try:
        # None: an island is lost, and the COMPILE op fails there.
        generation = self._global_client.check(program.islands)
      except StatusError as e:
        on_done(e.status, None)
        return
    key = program.key
    with self._lock:
      compiled = self._done.get(key)
      if compiled is None:
        first = key not in self._waiting
        if first:
          self.compiles += 1
          self._waiting[key] = (next(self._ids), program.islands, [])
        program_id, _, waiters = self._waiting[key]
        waiters.append((client, on_done))
      else:
        self._hold(key, 1)
    if compiled is not None:
      on_done(Status(), compiled)
      return
    if not first:
      return
    header: dict[str, Any] = {"devices": list(program.device_refs),
                              "replicas": program.replicas}
    # Its callbacks, which the worker binds (worker/callback_binding.py).
    if program.route:
      header["callbacks"] = {"route": program.route,
                             "count": program.callbacks.count}
    payload = payloads.encode(header, program.program, program.options)

    def finished(status: Status, results: list[bytes]) -> None:
      compiled = None
      if status.ok:
        try:
          compiled = CompiledProgram(program_id, program.islands,
                                     program.devices,
                                     json.loads(bytes(results[0])),
                                     payload, generation, key,
                                     program.route)
        except ValueError as e:
          status = Status(Code.INTERNAL, f"malformed compile result: {e}")
      with self._lock:
        under_way = self._waiting.get(key)
        if under_way is None or under_way[0] != program_id:
          return  # abandoned (and dropped on the workers)
        del self._waiting[key]
        waiters = [w for _, w in under_way[2]]
        if compiled is not None:
          self._done[key] = compiled
          self._hold(key, len(waiters))
      for waiter in waiters:
        waiter(status, compiled)

    self._dispatcher.submit(
        [IslandOp(island.id, OpKind.COMPILE, program_id, payload=payload)
         for island in program.islands], finished)

  def abandon(self, client: int) -> None:
    """Client `client` left: it waits for no compile. A compile nobody
    else waits for is dropped: the workers skip it if it has not begun
    (XLA cannot stop one that has), and keep nothing of it."""
    dropped = []
    with self._lock:
      for key, (program_id, islands, waiters) in list(self._waiting.items()):
        waiters[:] = [(c, w) for c, w in waiters if c != client]
        if not waiters:
          del self._waiting[key]
          dropped.append((program_id, islands))
    for program_id, islands in dropped:
      self._dispatcher.submit([IslandOp(island.id, OpKind.DELETE, program_id)
                               for island in islands])

  def _hold(self, key: str, count: int) -> None:
    self._holders[key] = self._holders.get(key, 0) + count
    self._unheld.pop(key, None)

  def release(self, program: CompiledProgram,
              dispatcher: Dispatcher | None = None) -> None:
    """One holder of `program` is done with it (see the class);
    `dispatcher`: the releasing client's, which submitted its launches."""
    with self._lock:
      if self._done.get(program.key) is not program:
        return  # freed already
      left = self._holders.get(program.key, 0) - 1
      if left > 0:
        self._holders[program.key] = left
      else:
        self._holders.pop(program.key, None)
      self._fences[program.key] = self._fences.get(program.key, 0) + 1
    # A gang in the client's own turn, numbered only after every launch it
    # submitted (some may wait in its queue while islands are saturated):
    # the program is freed only once every releaser's fence is numbered.
    (dispatcher or self._dispatcher).submit(
        [IslandOp(island.id, OpKind.DELETE, 0) for island in program.islands],
        lambda *_: self._fenced(program))

  def _fenced(self, program: CompiledProgram) -> None:
    freed = []
    key = program.key
    with self._lock:
      if self._done.get(key) is not program:
        return
      fences = self._fences.pop(key) - 1
      if fences:
        self._fences[key] = fences
      if fences or self._holders.get(key):
        return
      if program.route:  # nobody can compile the same route again
        freed.append(self._done.pop(key))
      else:
        self._unheld[key] = program
      while len(self._unheld) > KEEP_UNHELD:
        freed.append(self._done.pop(self._unheld.popitem(last=False)[0]))
    for p in freed:
      # Numbered after every launch of it: each was before some fence.
      self._dispatcher.submit([IslandOp(island.id, OpKind.DELETE,
                                        p.program_id)
                               for island in p.islands])

  def __len__(self) -> int:
    with self._lock:
      return len(self._done)

  def name(self, program_id: int) -> str:
    """The name of compiled program `program_id` (its XLA module's), for
    the errors that name it."""
    with self._lock:
      for program in self._done.values():
        if program.program_id == program_id:
          return str(program.metadata.get("name", program_id))
    return str(program_id)
