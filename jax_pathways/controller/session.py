"""Session: one client's IfrtSession stream, request by request.

Requests are handled strictly in arrival order, and every handler resolves
its inputs and registers its result handles before the next request starts:
a DestructArray arriving behind an Execute can never pull an array out from
under it. Handlers never wait for device data; they answer through a Reply,
at once or later from a completion callback, and replies leave in completion
order, matched by op_id.

One thread serves every session, so nothing may wait on it. A request that
needs what is not there yet (an upload still on its way, the workers of a
cluster still starting) raises Waiting before it changes anything: the
session holds it, and the requests behind it, until the service wakes it,
its deadline passes or the session ends; then it runs again from the start.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

from absl import logging

from jax_pathways import _core, _server, validation
from jax_pathways.controller import colocated_executable, moves
from jax_pathways.controller.array_store import ArrayStore, Layouts
from jax_pathways.controller.arrays import Array
from jax_pathways.controller.callback_router import CallbackRouter
from jax_pathways.controller.colocated_executable import ColocatedExecutable
from jax_pathways.controller.compile_cache import CompileCache
from jax_pathways.controller.coordination import GlobalClient
from jax_pathways.controller.dispatcher import (ClientDispatcher, Dispatcher,
                                                StageDest)
from jax_pathways.controller.handle_store import HandleStore, ServerHandles
from jax_pathways.controller.op_timing import Recording
from jax_pathways.controller.profile_executable import ProfileExecutable
from jax_pathways.programs.reader import ProgramReader
from jax_pathways.resources.resource_manager import ResourceManager
from jax_pathways.resources.topology import Topology
from jax_pathways.resources.virtual_slice import SliceRequest, VirtualSlice
from jax_pathways.status import (Code, Status, StatusError, from_exception,
                                 unimplemented)
from jax_pathways.wire import payloads
from jax_pathways.wire import protos


@dataclasses.dataclass
class Services:
  """What the controller lends every session."""
  topology: Topology
  # The controller's; a session's is its own ClientDispatcher of it.
  dispatcher: Dispatcher | ClientDispatcher
  host_buffers: _server.HostBuffers
  compile_cache: CompileCache
  resources: ResourceManager
  platform_version: str
  # Programs and arrays may span islands (the workers share a global client).
  spmd_across_islands: bool = False
  # Its generations: which workers programs spanning islands run on.
  global_client: GlobalClient | None = None
  # Where programs' callbacks go: their clients (controller/callback_router.py).
  callbacks: CallbackRouter | None = None
  # Who reads the programs clients compile (programs/reader.py: processes
  # of their own; None: this one), and the threads that wait for them
  # (None: the sessions thread; compile.py).
  programs: ProgramReader | None = None
  compiles: concurrent.futures.Executor | None = None
  wait_for_topology_s: float = 120.0
  upload_timeout_s: float = 600.0
  # Whose jax.profiler trace the islands record (shared by all sessions).
  recording: Recording = dataclasses.field(default_factory=Recording)
  # The C++ fast path of the steady-state requests (None: off), and
  # the array layouts it compares (controller/array_store.py).
  fast_path: _core.FastPath | None = None
  layouts: Layouts = dataclasses.field(default_factory=Layouts)
  # moves.planned's: planned ops by kind of move (a pipeline repeats its moves
  # every step).
  move_plans: dict[tuple[Any, ...], Any] = dataclasses.field(
      default_factory=dict)


class Waiting(Exception):
  """A request's handler needs something that is not there yet."""


class Reply:
  """The one answer to one request; may be sent from any thread, once."""

  def __init__(self, session: "Session", op_id: int, field: str):
    self._session = session
    self._op_id = op_id
    self._field = field
    self._sent = False
    self._lock = threading.Lock()

  def ok(self, fill: Callable[[Any], None] | None = None) -> None:
    response = self._session.new_response(self._op_id)
    body = getattr(response, self._field)
    body.SetInParent()  # an empty body must still be present
    if fill is not None:
      try:
        fill(body)
      except StatusError as e:
        self.error(e.status)
        return
      except Exception as e:  # pylint: disable=broad-except
        logging.exception("filling %s failed", self._field)
        self.error(Status(Code.INTERNAL, f"{self._field}: {e!r}"))
        return
    self._send(response)

  def error(self, status: Status) -> None:
    # An error reply carries no body: the client reads the status only then.
    response = self._session.new_response(self._op_id)
    response.response_metadata.status.code = int(status.code)
    response.response_metadata.status.message = status.message
    self._send(response)

  def status(self, status: Status) -> None:
    if status.ok:
      self.ok()
    else:
      self.error(status)

  def _send(self, response: Any) -> None:
    with self._lock:
      if self._sent:
        logging.error("second reply to op %d dropped", self._op_id)
        return
      self._sent = True
    self._session.send(response)
    self._session.replied()


# handler(session, request_body, reply); registered in handlers/__init__.py.
Handler = Callable[["Session", Any, Reply], None]
# stream_to() -> where an upload still arriving goes, (stage, dests), or
# None (take_uploads).
StreamTo = Callable[[], "tuple[int, list[StageDest]] | None"]


class Session:
  """State and request loop of one client session."""

  def __init__(self, session_id: int, protocol_version: int,
               services: Services, handlers: dict[str, Handler],
               result_handles: dict[str, Callable[[Any], list[int]]],
               send: Callable[[Any], Any],
               request: SliceRequest = SliceRequest(), peer: str = "",
               number: int = 0, weight: float = 1.0,
               wake: Callable[[], None] = lambda: None, stream: int = 0,
               settle: Callable[[], None] = lambda: None,
               callbacks_client: str | None = None,
               client_packages: str | None = None):
    # The id is a secret (it names the session's host buffers); `number`
    # is what others may see of this client.
    self.id = session_id
    self.number = number
    self.weight = weight
    # Everything this session submits is this client's (proportional share).
    services = dataclasses.replace(
        services, dispatcher=services.dispatcher.for_client(number, weight))
    self.peer = peer
    # The id under which the client serves its programs' callbacks
    # (client/host_callbacks.py); None: it serves none.
    self.callbacks_client = callbacks_client
    # What the client runs (colocated/packages.py), and the islands where
    # it may have colocated processes (ended with the session).
    self.client_packages = client_packages
    self.colocated_islands: set[int] = set()
    self.request = request  # the devices the client asked for
    self._slice: VirtualSlice | None = None
    self.protocol_version = protocol_version
    self.services = services
    # The fast path takes this stream's requests while none is with us;
    # settle() says one more has been handled (see _run).
    self.stream = stream
    self._settle = settle
    fast = services.fast_path
    if fast is not None:
      fast.open(stream, number, session_id)
    self.arrays = ArrayStore(fast, stream, services.layouts)
    self.executables: HandleStore[Any] = HandleStore("loaded executable")
    self.futures: HandleStore[Any] = HandleStore("future")
    self.execute_results: HandleStore[Any] = HandleStore("result status")
    self.server_handles = ServerHandles()
    self.send = send  # an IfrtResponse to the client; any thread
    self._handlers = handlers
    self._result_handles = result_handles
    self._response_cls = protos.msg("xla.ifrt.proxy.IfrtResponse")
    self._trace = logging.vlog_is_on(1)  # log every request
    self._lock = threading.Lock()
    self._unanswered = 0
    self._on_idle: Callable[[], None] | None = None
    # The request that waits (and those behind it); its wait's deadline;
    # the uploads it already took, kept for its next try.
    self._wake = wake
    self._waiting: Any = None
    self._backlog: collections.deque[Any] = collections.deque()
    self.deadline: float | None = None
    self._taken: dict[int, Any] = {}
    # Uploads the waiting request streams to workers: handle -> (stage,
    # islands); a PUT takes the stage (staged_put) or it is dropped.
    self._stages: dict[int, tuple[int, list[int]]] = {}
    self.ending = False
    # Its client closed its stream; an operator cancelled it (its requests
    # are answered CANCELLED from then on: grpc_service.py).
    self.half_closed = False
    self.cancelled = False

  @property
  def slice(self) -> VirtualSlice:
    """The client's devices, placed at first use (once every island has
    joined); a request that cannot fit fails every request that needs it."""
    if self._slice is None:
      topology = self.services.topology
      if not topology.complete:
        topology.when_complete(self._wake)
        self._wait(self.services.wait_for_topology_s, topology.incomplete)
      self._slice = self.services.resources.allocate(self.id, self.request)
    return self._slice

  def take_uploads(self, wanted: Mapping[int, StreamTo | None]
                   ) -> dict[int, payloads.Pieces]:
    """The client's uploads under the handles `wanted`, once all have
    arrived. Meanwhile each streams to the workers its stream_to() names,
    if any: all of them at once, as the client sends them at once."""
    missing = []
    for handle, stream_to in wanted.items():
      if handle in self._taken:
        continue
      taken = self._take(handle)
      if taken is None and stream_to is not None and handle not in self._stages:
        target = stream_to()
        if target is not None:
          stage, dests = target
          stream = self.services.dispatcher.stream_upload(stage, dests)
          taken = self._take(handle, stream)
          if taken is None:
            self._stages[handle] = (stage, [d.island for d in dests])
      if taken is None:  # the store wakes the service when it arrives
        missing.append(handle)
      else:
        self._taken[handle] = payloads.Pieces(*taken)
    if missing:
      timeout = self.services.upload_timeout_s
      self._wait(timeout, lambda: StatusError(
          Code.DEADLINE_EXCEEDED, f"the upload of host buffer {missing[0]} "
          f"did not arrive within {timeout:.0f} s"))
    return {handle: self._taken[handle] for handle in wanted}

  def take_upload(self, handle: int,
                  stream_to: StreamTo | None = None) -> payloads.Pieces:
    """take_uploads() of one."""
    return self.take_uploads({handle: stream_to})[handle]

  def _take(self, handle: int, stream: Any = None) -> Any:
    try:
      return self.services.host_buffers.take(self.id, handle, stream)
    except Exception as e:  # pylint: disable=broad-except
      raise from_exception(e) from None

  def staged_put(self, handles: Sequence[int]) -> int:
    """The stage the uploads `handles` streamed to, for the PUTs that take
    it (the session no longer drops it); 0 if not all of them streamed to
    one stage (that stage is dropped: the PUTs send their bytes)."""
    taken = [self._stages.pop(h, (0, [])) for h in handles]
    stages = {stage for stage, _ in taken}
    if len(stages) == 1:
      return stages.pop()
    self._unstage(taken)
    return 0

  def _drop_stages(self) -> None:
    """Stages no PUT took (the request failed, or the session ended)."""
    for handle in self._stages:
      self.services.host_buffers.unstream(self.id, handle)
    self._unstage(self._stages.values())
    self._stages.clear()

  def _unstage(self, stages: Iterable[tuple[int, list[int]]]) -> None:
    """Each stage of (stage, islands) once, on all its islands."""
    islands: dict[int, set[int]] = collections.defaultdict(set)
    for stage, on in stages:
      if stage:
        islands[stage].update(on)
    for stage, on in islands.items():
      self.services.dispatcher.unstage(sorted(on), stage)

  def _wait(self, timeout_s: float, expired: Callable[[], StatusError]
            ) -> None:
    """Parks the request being handled, or fails it once it has waited
    `timeout_s` or the session ends."""
    if self.ending:
      error = expired()
      raise StatusError(Code.CANCELLED, "the client's session ended while a "
                        f"request waited ({error.status.message})")
    if self.deadline is None:
      self.deadline = time.monotonic() + timeout_s
    elif time.monotonic() >= self.deadline:
      raise expired()
    raise Waiting()

  @property
  def waiting(self) -> bool:
    return self._waiting is not None

  def new_response(self, op_id: int) -> Any:
    response = self._response_cls()
    response.response_metadata.op_id = op_id
    return response

  def handle(self, request: Any) -> None:
    """Handles one request, or holds it behind one that waits; its reply
    may come later."""
    with self._lock:
      self._unanswered += 1
    if self._waiting is not None:
      self._backlog.append(request)
      return
    self._run(request)

  def resume(self) -> None:
    """Tries the waiting request again (its wait is over, timed out or
    cancelled), then the requests that came behind it."""
    request, self._waiting = self._waiting, None
    while request is not None:
      self._run(request)
      if self._waiting is not None:
        return
      request = self._backlog.popleft() if self._backlog else None

  def end(self) -> None:
    """No more requests: what waits fails when next tried."""
    self.ending = True

  def _run(self, request: Any) -> None:
    try:
      self._dispatch(request)
    except Waiting:
      self._waiting = request
      return
    self.deadline = None
    self._taken.clear()
    if self._stages:
      self._drop_stages()
    self.arrays.settle()
    self._settle()

  def _dispatch(self, request: Any) -> None:
    kind = request.WhichOneof("request")
    op_id = request.request_metadata.op_id
    if kind is None:
      reply = Reply(self, op_id, "")
      reply.error(Status(Code.INVALID_ARGUMENT, "request names no operation"))
      return
    reply = Reply(self, op_id, kind[:-len("_request")] + "_response")
    body = getattr(request, kind)
    if self._trace:
      logging.vlog(1, "client %d op %d: %s %s", self.number, op_id, kind,
                   str(body).replace("\n", " ")[:500])
    handler = self._handlers.get(kind)
    results = self._result_handles.get(kind)
    try:
      validation.check_list_sizes(body, kind)
      if results is not None:
        # Before anything else: a failure here must not poison (replace)
        # the live arrays those handles name.
        validation.check_new_handles(results(body), self.arrays, kind)
    except StatusError as e:
      reply.error(e.status)
      return
    try:
      if handler is None:
        raise unimplemented(f"{kind} is not supported by jax_pathways")
      handler(self, body, reply)
    except Waiting:
      raise
    except StatusError as e:
      self._poison_results(results, body, e.status)
      reply.error(e.status)
    except Exception as e:  # pylint: disable=broad-except
      logging.exception("client %d: %s failed", self.number, kind)
      status = Status(Code.INTERNAL, f"jax_pathways controller: {kind}: {e!r}")
      self._poison_results(results, body, status)
      reply.error(status)

  def replied(self) -> None:
    with self._lock:
      self._unanswered -= 1
      on_idle = self._on_idle if self._unanswered == 0 else None
      if on_idle is not None:
        self._on_idle = None
    if on_idle is not None:
      on_idle()

  def when_answered(self, on_idle: Callable[[], None]) -> None:
    """Calls `on_idle` once every request has its reply (now, or from the
    thread that sends the last one)."""
    with self._lock:
      if self._unanswered:
        self._on_idle = on_idle
        return
    on_idle()

  def _poison_results(self, results: Callable[[Any], list[int]] | None,
                      body: Any, status: Status) -> None:
    """Leaves the error under the client's result handles (IFRT semantics).
    They were checked to be new before the handler ran, so whatever a
    failed handler left under them is its own half-made work: let it go."""
    if results is None:
      return
    for h in results(body):
      if not 0 < h < validation.SERVER_HANDLES_START:
        continue  # refused as a handle: nothing was made under it
      made = self.arrays.discard(h)
      if made is not None:
        moves.release(self.services, [made])
      self.arrays.put(h, Array.failed(status))

  def describe(self) -> dict[str, Any]:
    """What `jax-pathways status` shows of this client."""
    held = self.services.resources.slice_of(self.id)
    per_island: dict[int, int] = {}
    seen: set[int] = set()
    topology = self.services.topology
    for array in self.arrays.values():
      if array.released or array.buffer in seen:
        continue
      seen.add(array.buffer)  # arrays sharing a buffer hold its bytes once
      for device, size in array.device_bytes().items():
        island = int(topology.island_of_device(device).id)
        per_island[island] = per_island.get(island, 0) + size
    return {
        "client": self.number,
        "peer": self.peer,
        "asked": self.request.describe(),
        "devices": list(held.physical_ids) if held else None,
        "arrays": len(self.arrays),
        "array_bytes": per_island,
        "executables": len(self.executables),
        "weight": self.weight,
        # Requests without their reply yet (one that waits holds those
        # behind it).
        "unanswered": self._unanswered,
        "waiting": self.waiting,
    }

  def let_go(self, exe: Any) -> None:
    """The client is done with executable `exe`: its programs are released
    (freed on the workers once no one holds them, compile_cache.py)."""
    services = self.services
    if isinstance(exe, ProfileExecutable):  # perhaps still recording
      exe.abandon(services)
      return
    if isinstance(exe, ColocatedExecutable):
      exe.drop(services)
      return
    for program in exe.programs():
      services.compile_cache.release(program, services.dispatcher)
      if program.route:
        # Nobody can compile the same route again: its callbacks and
        # answers go once its last launch (perhaps still waiting) has run.
        program.when_idle(lambda p=program: services.callbacks.release(
            p.route))

  def close(self) -> None:
    """Frees everything the session held, on controller and workers."""
    self._drop_stages()
    moves.release(self.services, self.arrays.drain())
    for exe in self.executables.drain():
      self.let_go(exe)
    # Its compiles nobody else waits for stop (those not begun).
    if self.services.compile_cache is not None:
      self.services.compile_cache.abandon(self.number)
    if self.colocated_islands:
      colocated_executable.end(self.services, self.number,
                               self.colocated_islands)
    self.futures.drain()
    self.execute_results.drain()
    self.services.resources.release(self.id)
    self.services.dispatcher.end()
    if self.services.callbacks is not None:
      self.services.callbacks.forget_session(self.callbacks_client,
                                             self.number)
