"""CallbackRouter: a program's callbacks run in its own client's process.

A compiled program that calls back (programs/custom_calls.py) gets a
route: the client that compiled it (the id its session named,
client/host_callbacks.py) and that client's table of host callbacks. Workers
ask over a connection of their own (role "callbacks", see
worker_listener.py and worker/callback_binding.py): run callback i of route r
on these operands, or answer this partitioner's question. The router sends
the ask down the client's stream (a gRPC stream the client opened,
CALLBACKS_METHOD) and the reply back to the worker.

Nothing here waits on anyone: a worker's replies are queued to a writer
thread of its own, a client's go through the gRPC server's queue. A
client's callbacks run only in that client: a route names one client, and
only that client's stream can answer for it. When a client's stream ends
(the process exited, was killed, or disconnected), everything it owed is
answered at once with UNAVAILABLE, so no island waits for it; a worker
that goes away drops its waits. A call for a client whose stream has not
opened yet waits CLIENT_WAIT_S for it.

Compile-time questions (what XLA's partitioner asks of custom_partitioning
and inspect_array_sharding) are asked once per route and question: the
answer is kept with the route, so the other islands of a program spanning
islands, and a recompile after a worker's loss, are answered without the
client. A route is released with its executable (or its session). A
partition answer is a program the asking worker's XLA inlines: it reaches
the workers only once `vet_answer` has read it as client programs are read
(in a reader process, off the sessions thread) and found nothing a worker
must not run; else the workers get the error.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import itertools
import json
import queue
import socket
import threading
import time
from typing import Any, Callable

from absl import logging

from jax_pathways import threads
from jax_pathways.status import Code, Status, StatusError, invalid_argument
from jax_pathways.wire import callback_messages as msg
from jax_pathways.wire.session_keys import CALLBACKS_HEADER

# How long a call waits for its client's stream to open.
CLIENT_WAIT_S = 30.0
# How often waits past their deadline are failed.
SWEEP_S = 0.5
# The longest client id a stream may name.
MAX_CLIENT_ID = 64
# Bytes of calls and questions one client may owe answers to: what the
# controller holds for its stream (gRPC's queue while the client does not
# read). A call past it fails at once, RESOURCE_EXHAUSTED: a client that
# stops reading its stream costs this much, never more, and no shared
# connection waits for it. Two of the largest calls (MAX_VALUES_BYTES).
MAX_OWED_BYTES = 2 * msg.MAX_VALUES_BYTES + (1 << 20)

Waiter = tuple["_WorkerLink", int]  # a worker's connection, its request id


@dataclasses.dataclass
class _Route:
  client: str
  table: int | None
  session: int   # the session's number, for messages
  # Compile-time answers by question, and questions in flight.
  answers: dict[bytes, tuple[dict[str, Any], list[bytes]]] = (
      dataclasses.field(default_factory=dict))
  asking: dict[bytes, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Pending:
  """A call or question sent (or to be sent) to a client."""
  client: str
  route: int
  message: bytes              # what the client is sent (b"" once sent)
  waiters: list[Waiter]
  memo: bytes | None          # the question's key (compile time)
  deadline: float             # until the client's stream opens
  sent: bool = False
  what: str | None = None     # a compile-time question's kind
  vetting: bool = False       # its answer is being read (vet_answer)
  size: int = 0               # of the message, counted until answered


class CallbackRouter:
  """Thread-safe; one per controller."""

  def __init__(self, send: Callable[[int, bytes], bool],
               finish: Callable[[int, int, str], None],
               vet_answer: Callable[[bytes, int], None],
               background: concurrent.futures.Executor):
    """send(stream, data) writes to a client's stream (False: it is gone);
    finish(stream, code, message) ends one; vet_answer(module, island)
    raises StatusError unless a partition answer's module may go to
    `island`'s worker, on a `background` thread (it waits for a reader)."""
    self._send = send
    self._finish = finish
    self._vet_answer = vet_answer
    self._background = background
    self._lock = threading.Lock()
    self._routes: dict[int, _Route] = {}
    self._route_ids = itertools.count(1)
    self._streams: dict[str, int] = {}    # client id -> its open stream
    self._clients: dict[int, str] = {}    # stream -> client id
    self._owners: dict[str, int] = {}     # client id -> its live session
    self._pending: dict[int, _Pending] = {}
    self._call_ids = itertools.count(1)
    self._workers: set[_WorkerLink] = set()
    self._stopped = False
    threads.start(self._sweep, "jp-callbacks")

  # ------------------------------------------------------------- routes
  def new_route(self, client: str, table: int | None, session: int) -> int:
    with self._lock:
      route = next(self._route_ids)
      self._routes[route] = _Route(client, table, session)
      return route

  def release(self, route: int) -> None:
    """The program of `route` is gone: forget its answers, and let its
    client forget its callables."""
    with self._lock:
      released = self._routes.pop(route, None)
      if released is None or released.table is None:
        return
      stream = self._streams.get(released.client)
    if stream is not None:
      self._send(stream, msg.encode({"kind": msg.FORGET,
                                     "table": released.table}))

  # ------------------------------------------------------------ clients
  def open_client(self, stream: int, client: str) -> None:
    """A client's callbacks stream opened (its token checked)."""
    if not client or len(client) > MAX_CLIENT_ID:
      self._finish(stream, int(Code.INVALID_ARGUMENT),
                   f"a callbacks stream needs a {CALLBACKS_HEADER} header of up to "
                   f"{MAX_CLIENT_ID} characters")
      return
    with self._lock:
      refused = client in self._streams
      if not refused:
        self._streams[client] = stream
        self._clients[stream] = client
        unsent = [p for p in self._pending.values()
                  if p.client == client and not p.sent]
        messages = [p.message for p in unsent]
        for p in unsent:
          p.sent = True
          p.message = b""
    if refused:
      self._finish(stream, int(Code.ALREADY_EXISTS),
                   "this client's callbacks are served on another stream")
      return
    for message in messages:
      self._send(stream, message)

  def from_client(self, stream: int, data: bytes) -> None:
    """A client's reply; anything malformed ends its stream."""
    with self._lock:
      client = self._clients.get(stream)
    if client is None:
      return
    try:
      header, blobs = msg.decode(data)
      if header["kind"] != msg.REPLY:
        raise ValueError(f"a client sends replies, not {header['kind']!r}")
    except (ValueError, KeyError) as e:
      self._finish(stream, int(Code.INVALID_ARGUMENT),
                   f"malformed callback reply: {e}")
      return
    call_id = header["id"]
    with self._lock:
      pending = self._pending.get(call_id)
      if pending is None or pending.client != client or pending.vetting:
        return  # its waiters went away, or it was answered for them
      # Kept pending while read: workers asking meanwhile wait with it.
      pending.vetting = (pending.what == msg.PARTITION and
                         "error" not in header)
      island = pending.waiters[0][0].island
    answer = ({k: v for k, v in header.items() if k not in ("kind", "id")},
              blobs)
    if pending.vetting:
      # Its own bytes, not the message's: read later, elsewhere.
      self._background.submit(self._vetted, call_id, island,
                              (answer[0], [bytes(b) for b in blobs]))
      return
    self._answered(call_id, answer)

  def _vetted(self, call_id: int, island: int,
              answer: tuple[dict[str, Any], list[Any]]) -> None:
    """A partition answer goes to the workers once its module is vetted;
    else they get why not."""
    module = answer[0].get("module")
    try:
      if type(module) is not int or not 0 <= module < len(answer[1]):  # pylint: disable=unidiomatic-typecheck
        raise invalid_argument("the client's partition answer has no module")
      self._vet_answer(answer[1][module], island)
    except Exception as e:  # pylint: disable=broad-except
      status = getattr(e, "status", None) or Status(Code.INTERNAL, str(e))
      answer = ({"error": {"code": int(status.code),
                           "message": status.message}}, [])
    self._answered(call_id, answer)

  def _answered(self, call_id: int,
                answer: tuple[dict[str, Any], list[Any]]) -> None:
    """Replies to the waiters of call `call_id` (if it still has them); a
    compile-time answer is kept."""
    with self._lock:
      pending = self._pending.pop(call_id, None)
      if pending is None:
        return  # failed meanwhile (its client left)
      route = self._routes.get(pending.route)
      if route is not None and pending.memo is not None:
        route.asking.pop(pending.memo, None)
        if "error" not in answer[0]:  # kept: its own bytes
          answer = (answer[0], [bytes(b) for b in answer[1]])
          route.answers[pending.memo] = answer
    for link, request in pending.waiters:
      link.reply(request, answer)

  def close_client(self, stream: int) -> None:
    """A client's callbacks stream ended: what it owed fails now."""
    with self._lock:
      client = self._clients.pop(stream, None)
      if client is None:
        return
      if self._streams.get(client) == stream:
        del self._streams[client]
      owed = [cid for cid, p in self._pending.items()
              if p.client == client and p.sent]
    self._fail(owed, Status(
        Code.UNAVAILABLE,
        "the client whose callback this is disconnected (its process "
        "exited or its callbacks stream closed) before it answered"))

  def claim(self, client: str, session: int) -> bool:
    """Session `session` names callbacks id `client`: it is that session's
    until it ends (False: another live session's; a token holder who
    learnt the id may not have that client's callbacks routed to it, nor
    its programs' calls routed to that client)."""
    with self._lock:
      return self._owners.setdefault(client, session) == session

  def forget_session(self, client: str | None, session: int) -> None:
    """A session ended: release its routes and its callbacks id."""
    if client is None:
      return
    with self._lock:
      if self._owners.get(client) == session:
        del self._owners[client]
      mine = [r for r, route in self._routes.items()
              if route.client == client and route.session == session]
    for route in mine:
      self.release(route)

  # ------------------------------------------------------------ workers
  def add_worker(self, sock: socket.socket, island: int) -> None:
    """A worker's callbacks connection, authenticated."""
    link = _WorkerLink(sock, island, self._from_worker, self._worker_gone)
    with self._lock:
      if self._stopped:
        link.close()
        return
      self._workers.add(link)
    link.start()

  def _from_worker(self, link: "_WorkerLink", data: bytearray) -> None:
    header, blobs = msg.decode(data)
    request, kind = header["id"], header["kind"]
    try:
      if kind == msg.CALL:
        self._call(link, request, header, blobs)
      elif kind == msg.ASK:
        self._ask(link, request, header, blobs)
      else:
        raise invalid_argument(f"workers call or ask, not {kind!r}")
    except Exception as e:  # pylint: disable=broad-except
      status = getattr(e, "status", None) or Status(Code.INTERNAL, str(e))
      link.send(msg.error_reply(request, status))

  def _route(self, route_id: Any) -> _Route:
    """Requires _lock. The route a worker names (anything: from the wire)."""
    route = self._routes.get(route_id)
    if route is None:
      raise invalid_argument(
          f"callback route {route_id!r} is unknown: its program was "
          "released (its executable was deleted, or its client is gone)")
    return route

  def _call(self, link: "_WorkerLink", request: int, header: dict[str, Any],
            blobs: list[memoryview]) -> None:
    call_id = next(self._call_ids)
    route_id = header.get("route")
    with self._lock:
      table = self._route(route_id).table
    message = msg.encode({"kind": msg.CALL, "id": call_id, "table": table,
                          "index": header.get("index"),
                          "args": header.get("args")}, blobs)
    with self._lock:
      stream = self._register(call_id, route_id, message, (link, request),
                              None)
    self._deliver(stream, message)

  def _ask(self, link: "_WorkerLink", request: int, header: dict[str, Any],
           blobs: list[memoryview]) -> None:
    what = header.get("what")
    if what not in msg.ASKS:
      raise invalid_argument(f"unknown compile-time question {what!r}")
    key = hashlib.sha256(json.dumps([what, header.get("question")],
                                    sort_keys=True).encode())
    for b in blobs:
      key.update(len(b).to_bytes(8, "little"))
      key.update(b)
    memo = key.digest()
    call_id = next(self._call_ids)
    message = msg.encode({"kind": msg.ASK, "id": call_id, "what": what,
                          "question": header.get("question")}, blobs)
    route_id = header.get("route")
    with self._lock:
      route = self._route(route_id)
      answer = route.answers.get(memo)
      if answer is None:
        asked = route.asking.get(memo)
        if asked is not None and asked in self._pending:
          self._pending[asked].waiters.append((link, request))
          return
        stream = self._register(call_id, route_id, message, (link, request),
                                memo, what)
    if answer is not None:
      link.reply(request, answer)
      return
    self._deliver(stream, message)

  def _register(self, call_id: int, route_id: int, message: bytes,
                waiter: Waiter, memo: bytes | None,
                what: str | None = None) -> int | None:
    """Requires _lock. Records a call or question for the route's client;
    returns the client's stream (None: it waits for one to open)."""
    route = self._route(route_id)  # released meanwhile?
    owed = sum(p.size for p in self._pending.values()
               if p.client == route.client)
    if owed + len(message) > MAX_OWED_BYTES:
      raise StatusError(Code.RESOURCE_EXHAUSTED, (
          f"client {route.session} has not answered {owed >> 20} MiB of "
          f"host callback calls, and this one ({len(message) >> 20} MiB) "
          f"would pass the {MAX_OWED_BYTES >> 20} MiB the controller holds "
          "for one client: it does not read its callbacks stream, or its "
          "callbacks are slower than its programs"))
    stream = self._streams.get(route.client)
    self._pending[call_id] = _Pending(
        route.client, route_id, b"" if stream is not None else message,
        [waiter], memo, time.monotonic() + CLIENT_WAIT_S,
        sent=stream is not None, what=what, size=len(message))
    if memo is not None:
      route.asking[memo] = call_id
    return stream

  def _deliver(self, stream: int | None, message: bytes) -> None:
    if stream is not None and not self._send(stream, message):
      self.close_client(stream)

  def _worker_gone(self, link: "_WorkerLink") -> None:
    with self._lock:
      self._workers.discard(link)
      for p in self._pending.values():
        p.waiters = [w for w in p.waiters if w[0] is not link]

  # ------------------------------------------------------------ failing
  def _fail(self, call_ids: list[int], status: Status) -> None:
    with self._lock:
      failed = [self._pending.pop(c) for c in call_ids if c in self._pending]
      for p in failed:
        route = self._routes.get(p.route)
        if route is not None and p.memo is not None:
          route.asking.pop(p.memo, None)
    for p in failed:
      for link, request in p.waiters:
        link.send(msg.error_reply(request, status))

  def _sweep(self) -> None:
    """Fails calls whose client never opened its stream."""
    while not self._stopped:
      time.sleep(SWEEP_S)
      now = time.monotonic()
      with self._lock:
        late = [c for c, p in self._pending.items()
                if not p.sent and p.deadline <= now]
      if late:
        self._fail(late, Status(
            Code.UNAVAILABLE,
            f"the client whose callback this is has no callbacks stream "
            f"open (none came within {CLIENT_WAIT_S:g} s): it runs without "
            "jax_pathways in its process, or its stream cannot reach the "
            "controller"))

  def calling_back(self, session: int) -> bool:
    """Whether a program of client `session` waits for it to answer a
    host callback now."""
    with self._lock:
      return any(p.sent and p.memo is None and
                 getattr(self._routes.get(p.route), "session", None) == session
                 for p in self._pending.values())

  def stats(self) -> dict[str, int]:
    with self._lock:
      return {"routes": len(self._routes), "clients": len(self._streams),
              "pending": len(self._pending), "workers": len(self._workers)}

  def stop(self) -> None:
    with self._lock:
      self._stopped = True
      workers = list(self._workers)
    for link in workers:
      link.close()


class _WorkerLink:
  """One worker's callbacks connection: a reader thread, and a writer
  thread so that a frozen worker holds nobody who answers it."""

  def __init__(self, sock: socket.socket, island: int,
               on_message: Callable[["_WorkerLink", bytearray], None],
               on_gone: Callable[["_WorkerLink"], None]):
    self.island = island
    self._sock = sock
    self._on_message = on_message
    self._on_gone = on_gone
    self._out: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
    self._closed = False

  def start(self) -> None:
    threads.start(self._read, f"jp-cb-in-{self.island}")
    threads.start(self._write, f"jp-cb-out-{self.island}")

  def send(self, data: bytes) -> None:
    if not self._closed:
      self._out.put(data)

  def reply(self, request: int, answer: tuple[dict[str, Any], list[Any]]
            ) -> None:
    """Answers the worker's `request` with a client's (header, blobs)."""
    self.send(msg.encode({"kind": msg.REPLY, "id": request, **answer[0]},
                         answer[1]))

  def close(self) -> None:
    if self._closed:
      return
    self._closed = True
    self._out.put(None)
    with contextlib.suppress(OSError):
      self._sock.shutdown(socket.SHUT_RDWR)

  def _read(self) -> None:
    try:
      while True:
        data = msg.read_frame(self._sock)
        if data is None:
          break
        self._on_message(self, data)
    except (OSError, ValueError, KeyError) as e:
      if not self._closed:
        logging.warning("island %d's callbacks connection broke: %s",
                        self.island, e)
    finally:
      self.close()
      self._on_gone(self)

  def _write(self) -> None:
    try:
      while True:
        data = self._out.get()
        if data is None:
          return
        msg.write_frame(self._sock, data)
    except OSError:
      self.close()
    finally:
      self._sock.close()

