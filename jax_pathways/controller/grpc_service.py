"""GrpcService: the controller's gRPC face, and nothing else.

The C++ _server.GrpcServer terminates gRPC (xla.ifrt.proxy.GrpcIfrtService
and jax_pathways.Admin) and serves the host-buffer side channel itself; this
module takes its events in batches on one thread: it opens sessions (checking
version and cluster token), feeds them their requests in order, closes them,
and answers GetVersion and the admin calls (Status, Trace). Sessions do the
work. That thread serves everyone, so it never waits: a session whose
request waits for something (session.Waiting) is parked and tried again when
the server wakes it, when its deadline passes, or when it ends. Every call
gets an answer, whatever bytes it carried.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import secrets
import threading
import time
from typing import Any, Callable, Iterator

from absl import logging

from jax_pathways import _server
from jax_pathways import config
from jax_pathways import threads
from jax_pathways.controller import op_payloads
from jax_pathways.controller import op_timing
from jax_pathways.controller import versions
from jax_pathways.controller.handlers import HANDLERS, RESULT_HANDLES
from jax_pathways.controller.session import Services, Session
from jax_pathways.resources.virtual_slice import SliceRequest
from jax_pathways.status import (Code, Status, StatusError, invalid_argument,
                                 unimplemented)
from jax_pathways.wire import protos
from jax_pathways.wire.session_keys import (
    ADMIN_CANCEL, ADMIN_CHECK_SLICE, ADMIN_PING, ADMIN_SERVICE, ADMIN_STATUS,
    ADMIN_SUPERVISION, ADMIN_TRACE, CALLBACKS_HEADER, CALLBACKS_KEY, CALLBACKS_METHOD,
    DEVICES_KEY, ISLAND_KEY, PACKAGES_KEY, SESSION_METADATA, TOKEN_HEADER,
    TOKEN_KEY, WEIGHT_KEY)

GET_VERSION = "/xla.ifrt.proxy.GrpcIfrtService/GetVersion"
# What a session without the right token is told, as the status of its
# InitRequest (GrpcService._refuse). JAX's client retries a failed
# InitRequest until its connection timeout (120 s by default; pathwaysutils
# reads PATHWAYS_PROXY_CONNECTION_TIMEOUT_SECS) and then raises with this
# message.
REFUSED = ("jax_pathways: wrong or missing cluster token. Connect through "
           "`jax-pathways connect --controller HOST:PORT` (it adds the "
           "token from JAX_PATHWAYS_TOKEN) and point JAX_BACKEND_TARGET at "
           "the address it prints, or call "
           "jax_pathways.initialize(address, token=...)")
# How long a refused stream stays open: none of its messages is read, but
# JAX's client must have sent its InitRequest (it does right after opening
# the stream) before its answer comes, or it drops the answer.
REFUSED_AFTER_S = 0.5
# The op id of a session's InitRequest from JAX's client (its first).
INIT_OP_ID = 1
# How the stream of a client an operator cancelled ends.
CANCELLED = ("jax_pathways: an operator cancelled this client "
             "(`jax-pathways cancel`): its session, arrays and programs are "
             "gone; start a new process to use the cluster again")
# How long a cancelled client's stream answers its requests so.
CANCELLED_LINGER_S = 300.0

Event = _server.EventKind


class GrpcService:
  """Sessions over the C++ gRPC server."""

  def __init__(self, server: Any, services: Services, token: str | None,
               status: Callable[[], dict[str, Any]],
               supervised: Callable[[dict[str, Any]], None],
               cancelled: Callable[[int], None]):
    """cancelled(client): an operator ended client `client`'s session
    (controller/run_bounds.py takes its programs' islands back)."""
    self.services = services
    self._token = token
    self._status = status
    self._supervised = supervised
    self._cancelled = cancelled
    self._server = server  # _server.GrpcServer
    self._lock = threading.Lock()
    self.sessions: dict[int, Session] = {}  # by stream id
    self._parked: dict[int, Session] = {}  # sessions whose request waits
    self._refused: dict[int, float] = {}  # stream -> its end (wrong token)
    # Clients' callbacks streams (controller/callback_router.py), by stream id.
    self._callback_streams: set[int] = set()
    # Closed by their clients, answered by Python, to end (_end_closed).
    self._closing: dict[int, Session] = {}
    # Streams of sessions an operator cancelled and that have been closed:
    # every request on them is answered CANCELLED until the client ends
    # them or CANCELLED_LINGER_S pass (stream -> that deadline).
    self._cancelled_streams: dict[int, float] = {}
    self._numbers = itertools.count(1)
    self._stopping = False
    self._thread: threading.Thread | None = None

  def start(self, bind: str) -> int:
    fast = self.services.fast_path
    if fast is not None:  # steady-state requests answered in C++
      self._server.set_request_hook(fast.hook())
      fast.attach(self._server.reply_sink())
      fast.set_fetch_payload(op_payloads.fetch(None))
    # gRPC refuses a longer message from its length prefix, before
    # buffering it (RESOURCE_EXHAUSTED "Received message larger than max").
    cfg = config.from_env()
    port = self._server.start(bind, cfg.max_request_mib << 20,
                              cfg.first_message_timeout,
                              python_unary=[GET_VERSION, ADMIN_SERVICE],
                              python_streams=[CALLBACKS_METHOD])
    self._thread = threads.start(self._loop, "jp-sessions")
    return port

  def stop(self) -> None:
    self._stopping = True
    if self.services.fast_path is not None:
      self.services.fast_path.detach()  # replies from now on go nowhere
    self._server.shutdown()
    if self._thread is not None:
      self._thread.join(timeout=10)
    with self._lock:
      sessions = list(self.sessions.values())
      self.sessions.clear()
    for session in sessions:
      session.close()

  def live_clients(self) -> set[int]:
    """The numbers of the clients whose sessions have not ended."""
    with self._lock:
      return {s.number for s in self.sessions.values() if not s.ending}

  def _loop(self) -> None:
    handlers = {Event.OPEN: self._open, Event.REQUEST: self._request,
                Event.CLOSED: self._closed, Event.UNARY: self._unary,
                Event.WAKE: lambda *_: None}
    while True:
      events = self._server.poll(self._poll_timeout(), 256)
      if not events and self._stopping:
        return
      # A burst of requests (chained calls) reaches each worker as one
      # write, and its replies start one write per client.
      with self.services.dispatcher.corked(), self._corked():
        for kind, call, data, method, metadata, peer in events:
          try:
            handlers[kind](call, data, method, metadata, peer)
          except StatusError as e:  # a malformed call: no traceback to log
            logging.vlog(1, "call %d refused: %s", call, e.status)
            self._answer_failed(kind, call, e)
          except Exception as e:  # pylint: disable=broad-except
            logging.exception("frontend event %s on call %d failed", kind,
                              call)
            self._answer_failed(kind, call, e)
        self._resume(woken=any(e[0] == Event.WAKE for e in events))
        self._expire_refused()
        self._end_closed()

  @contextlib.contextmanager
  def _corked(self) -> Iterator[None]:
    self._server.cork()
    try:
      yield
    finally:
      self._server.uncork()

  def _answer_failed(self, kind: Event, call: int, e: Exception) -> None:
    """A call whose event could not be handled still gets an answer."""
    status = (e.status if isinstance(e, StatusError) else
              Status(Code.INTERNAL, f"jax_pathways controller: {e!r}"))
    if kind == Event.UNARY:
      self._server.reply(call, int(status.code), status.message, b"")
    elif kind in (Event.OPEN, Event.REQUEST):
      # Ends this client's stream only; its CLOSED event frees the session.
      self._server.finish(call, int(status.code), status.message)

  def _poll_timeout(self) -> float:
    """Until the earliest parked deadline, at most 0.5 s."""
    now = time.monotonic()
    deadlines = [s.deadline for s in self._parked.values()
                 if s.deadline is not None] + list(self._refused.values())
    earliest = min(deadlines, default=now + 0.5)
    return min(0.5, max(0.0, earliest - now))

  def _resume(self, woken: bool) -> None:
    """Tries parked sessions again: all of them after a wake (cheap: the
    request finds what it waits for or parks again), else those whose
    deadline passed or whose client has gone."""
    now = time.monotonic()
    for stream, session in list(self._parked.items()):
      if (woken or session.ending or
          (session.deadline is not None and now >= session.deadline)):
        session.resume()
        if not session.waiting:
          del self._parked[stream]

  # --------------------------------------------------------------- sessions
  def _open(self, stream: int, data: bytes, method: str,
            metadata: dict[str, bytes], peer: str) -> None:
    if method == CALLBACKS_METHOD:
      self._open_callbacks(stream, metadata)
      return
    raw = metadata.get(SESSION_METADATA)
    if raw is None:
      self._server.finish(stream, Code.INVALID_ARGUMENT,
                          "IfrtSession without session metadata")
      return
    meta = _parse("xla.ifrt.proxy.GrpcIfrtSessionMetadata", raw,
                  "session metadata")
    if not self._token_ok(_attribute(meta, TOKEN_KEY) or ""):
      # JAX's client retries about once a second: log the first of a burst.
      logging.log_every_n_seconds(
          logging.INFO, "refused a session from %s: wrong or missing "
          "cluster token", 30, peer)
      self._refused[stream] = time.monotonic() + REFUSED_AFTER_S
      return
    version = meta.version.protocol_version
    if not (versions.MIN_PROTOCOL_VERSION <= version <=
            versions.MAX_PROTOCOL_VERSION):
      self._server.finish(stream, Code.INVALID_ARGUMENT,
                          f"protocol version {version} is not supported")
      return
    try:
      request = SliceRequest.parse(_attribute(meta, DEVICES_KEY),
                                   _attribute(meta, ISLAND_KEY))
      callbacks_client = _attribute(meta, CALLBACKS_KEY)
      client_packages = (_attribute(meta, PACKAGES_KEY) or "")[:1024]
      weight = _weight(_attribute(meta, WEIGHT_KEY))
    except StatusError as e:
      self._server.finish(stream, e.status.code, e.status.message)
      return
    number = next(self._numbers)
    callbacks = self.services.callbacks
    if callbacks_client and callbacks is not None and not callbacks.claim(
        callbacks_client, number):
      self._server.finish(stream, Code.ALREADY_EXISTS, (
          "jax_pathways: this session names the callbacks id of another "
          "live session; each session's callbacks are its own (a client "
          "makes a fresh id per session)"))
      return
    self._server.admit(stream)  # its requests are read from now on
    # Session ids name a session's host buffers: random, so one client
    # cannot guess another's.
    session_id = secrets.randbits(62) | 1
    self.services.host_buffers.open_session(session_id)
    server = self._server
    session = Session(session_id, version, self.services, HANDLERS,
                      RESULT_HANDLES,
                      send=lambda r: server.send(stream, r.SerializeToString()),
                      request=request, peer=peer,
                      number=number, weight=weight,
                      wake=server.wake, stream=stream,
                      settle=lambda: server.settle(stream),
                      callbacks_client=callbacks_client or None,
                      client_packages=client_packages or None)
    with self._lock:
      self.sessions[stream] = session
    logging.info("client %d opened a session (protocol %d, peer %s, asks "
                 "for %s, weight %g)", session.number, version, peer,
                 request.describe(), weight)

  def _open_callbacks(self, stream: int, metadata: dict[str, bytes]) -> None:
    try:
      self._check_admin_token(metadata)
      if self.services.callbacks is None:
        raise unimplemented("this controller serves no callbacks")
    except StatusError as e:
      self._server.finish(stream, int(e.status.code), e.status.message)
      return
    self._callback_streams.add(stream)
    self._server.admit(stream)
    self.services.callbacks.open_client(
        stream, metadata.get(CALLBACKS_HEADER, b"").decode(errors="replace"))

  def _request(self, stream: int, data: bytes, *_: Any) -> None:
    if stream in self._callback_streams:
      self.services.callbacks.from_client(stream, data)
      return
    session = self.sessions.get(stream)
    if stream in self._cancelled_streams or (session is not None and
                                             session.cancelled):
      self._answer_cancelled(stream, data)
      return
    if session is None:
      return  # refused at open; its stream is finishing
    # Unparsable: there is no op_id to answer, so the failure ends this
    # client's stream (_answer_failed), nobody else's.
    session.handle(_parse("xla.ifrt.proxy.IfrtRequest", data, "IfrtRequest"))
    if session.waiting:
      self._parked[stream] = session

  def _expire_refused(self) -> None:
    now = time.monotonic()
    for stream, deadline in list(self._refused.items()):
      if now >= deadline:
        del self._refused[stream]
        self._refuse(stream)
    for stream, deadline in list(self._cancelled_streams.items()):
      if now >= deadline:
        del self._cancelled_streams[stream]
        self._server.finish(stream, Code.CANCELLED, CANCELLED)

  def _answer_cancelled(self, stream: int, data: bytes) -> None:
    """Answers a request of a cancelled client with why it fails (JAX's
    client shows a request's status, not how its stream ended)."""
    request = _parse("xla.ifrt.proxy.IfrtRequest", data, "IfrtRequest")
    self._answer_failed_request(stream, request.request_metadata.op_id,
                                Code.CANCELLED, CANCELLED)

  def _answer_failed_request(self, stream: int, op_id: int, code: Code,
                             message: str) -> None:
    """Sends request `op_id` of `stream` its failure, with no body."""
    response = protos.msg("xla.ifrt.proxy.IfrtResponse")()
    response.response_metadata.op_id = op_id
    response.response_metadata.status.code = int(code)
    response.response_metadata.status.message = message
    self._server.send(stream, response.SerializeToString())

  def _refuse(self, stream: int) -> None:
    """Fails a refused stream's InitRequest UNAUTHENTICATED, unread, then
    ends the stream. JAX's client numbers a session's requests from 1, its
    InitRequest first, and passes on that request's status alone (it
    cancels the stream before reading how the server ended it: the user
    would read CANCELLED)."""
    self._answer_failed_request(stream, INIT_OP_ID, Code.UNAUTHENTICATED,
                                REFUSED)
    self._server.finish(stream, Code.UNAUTHENTICATED, REFUSED)

  def _closed(self, stream: int, *_: Any) -> None:
    """No more requests: end the stream once every reply is out."""
    if stream in self._callback_streams:
      self._callback_streams.discard(stream)
      self.services.callbacks.close_client(stream)
      self._server.finish(stream, 0, "")
      return
    if self._refused.pop(stream, None) is not None:
      self._refuse(stream)
      return
    if self._cancelled_streams.pop(stream, None) is not None:
      self._server.finish(stream, 0, "")
      return
    session = self.sessions.get(stream)
    if session is None:
      return
    session.half_closed = True
    self._end_session(stream, session)

  def _end_session(self, stream: int, session: Session) -> None:
    """Ends `session` once every reply is out (_end_closed)."""
    session.end()  # what waits fails now (_resume)

    def answered() -> None:  # on any thread
      with self._lock:
        self._closing[stream] = session
      self._server.wake()

    session.when_answered(answered)

  def _end_closed(self) -> None:
    """Ends the streams whose clients closed them and that have every
    reply: Python's, and the fast path's, which come later from the
    dispatcher's threads (a stream ended before them loses them; the fast
    path wakes this loop once it has sent them)."""
    if not self._closing:  # read without the lock: answered() wakes us
      return
    fast = self.services.fast_path
    with self._lock:
      closing = [(stream, session) for stream, session in
                 self._closing.items()
                 if fast is None or fast.paid_or_wake(stream)]
      for stream, _ in closing:
        del self._closing[stream]
      # Once each (a cancelled session may have been ended twice).
      closing = [(stream, session) for stream, session in closing
                 if self.sessions.pop(stream, None) is not None]
    for stream, session in closing:
      if session.cancelled and not session.half_closed:
        # Its client still sends: it learns why from each answer.
        self._cancelled_streams[stream] = (time.monotonic() +
                                           CANCELLED_LINGER_S)
      else:
        self._server.finish(stream, 0, "")
      session.close()
      self.services.host_buffers.close_session(session.id)
      logging.info("client %d closed its session", session.number)

  def _token_ok(self, given: str) -> bool:
    # As bytes: compare_digest refuses str that are not ASCII.
    return not self._token or secrets.compare_digest(given.encode(),
                                                     self._token.encode())

  # ----------------------------------------------------------- unary calls
  def _unary(self, call: int, data: bytes, method: str,
             metadata: dict[str, bytes], peer: str) -> None:
    try:
      if method == GET_VERSION:
        reply = self._get_version(data)
      elif method == ADMIN_PING:
        reply = b""
      elif method == ADMIN_STATUS:
        self._check_admin_token(metadata)
        reply = json.dumps(self._status()).encode()
      elif method == ADMIN_CHECK_SLICE:
        self._check_admin_token(metadata)
        reply = self._check_slice(data)
      elif method == ADMIN_SUPERVISION:
        self._check_admin_token(metadata)
        self._supervised(_supervision(
            data, self.services.topology.expected_islands))
        reply = b"{}"
      elif method == ADMIN_TRACE:
        self._check_admin_token(metadata)
        self._admin_trace(call, data)
        return  # answered when the islands have done it
      elif method == ADMIN_CANCEL:
        self._check_admin_token(metadata)
        reply = self._cancel(data)
      else:
        raise unimplemented(f"no method {method}")
    except StatusError as e:
      self._server.reply(call, int(e.status.code), e.status.message, b"")
      return
    self._server.reply(call, 0, "", reply)

  def _get_version(self, data: bytes) -> bytes:
    req = _parse("xla.ifrt.proxy.GrpcGetVersionRequest", data,
                 "GetVersion request")
    protocol, serdes = versions.negotiate(req.min_version, req.max_version)
    resp = protos.msg("xla.ifrt.proxy.GrpcGetVersionResponse")()
    resp.version.protocol_version = protocol
    resp.version.ifrt_serdes_version_number = serdes
    return resp.SerializeToString()

  def _check_admin_token(self, metadata: dict[str, bytes]) -> None:
    given = metadata.get(TOKEN_HEADER, b"").decode(errors="replace")
    if not self._token_ok(given):
      raise StatusError(Code.UNAUTHENTICATED, "wrong cluster token")

  def _check_slice(self, data: bytes) -> bytes:
    """Places a slice request without keeping it: what a client asking for
    it would be told (before jaxlib's client hides it behind retries)."""
    try:
      asked = json.loads(data or b"{}")
      request = SliceRequest.parse(asked.get("devices"), asked.get("island"))
    except (ValueError, AttributeError):
      raise invalid_argument(
          'CheckSlice takes {"devices": "2x4", "island": "1"}') from None
    if self.services.topology.complete:  # else Init will tell
      self.services.resources.check(request)
    return b"{}"

  def _cancel(self, data: bytes) -> bytes:
    """Ends a client's session at an operator's word: its stream ends
    CANCELLED, what it held is freed as when it leaves, and islands running
    its programs are taken back."""
    try:
      number = int(json.loads(data or b"{}")["client"])
    except (ValueError, KeyError, TypeError, AttributeError):
      raise invalid_argument('Cancel takes {"client": N}, a client number '
                             '`jax-pathways status` lists') from None
    with self._lock:
      found = [(stream, session) for stream, session in self.sessions.items()
               if session.number == number and not session.ending]
    if not found:
      raise StatusError(Code.NOT_FOUND, f"no live client {number} "
                        "(`jax-pathways status` lists the clients)")
    logging.warning("client %d cancelled by an operator", number)
    stream, session = found[0]
    session.cancelled = True  # its new requests are answered CANCELLED
    self._cancelled(number)  # its programs' islands are taken back now
    # What it waits for fails with the islands, or comes; then the session
    # closes as if its client had left.
    self._end_session(stream, session)
    return json.dumps({"client": number}).encode()

  def _admin_trace(self, call: int, data: bytes) -> None:
    try:
      action = json.loads(data or b"{}").get("action")
    except (ValueError, AttributeError):
      raise invalid_argument(
          'Trace takes {"action": "start" | "stop"}') from None
    server = self._server
    op_timing.trace(self.services.topology, self.services.dispatcher, action,
                  lambda status, body: server.reply(call, int(status.code),
                                                    status.message, body))


def _supervision(data: bytes, islands: int) -> dict[str, Any]:
  """A supervisor's report (admin.report_supervision), checked."""
  try:
    report = json.loads(data)
    checked = {"island": int(report["island"]), "pid": int(report["pid"]),
               "restarts": int(report["restarts"]),
               "given_up": str(report["given_up"])[:2000]}
  except (ValueError, TypeError, KeyError):
    raise invalid_argument('Supervision takes {"island": N, "pid": N, '
                           '"restarts": N, "given_up": "why"}') from None
  if not 0 <= checked["island"] < islands:
    raise invalid_argument(f"no island {checked['island']}")
  return checked


def _parse(message: str, data: bytes, what: str) -> Any:
  try:
    return protos.msg(message).FromString(data)
  except Exception:  # pylint: disable=broad-except
    raise invalid_argument(f"jax_pathways: unparsable {what}") from None


def _attribute(meta: Any, key: str) -> str | None:
  """A string the client put in its session's initialization data."""
  value = meta.initialization_data.attributes.get(key)
  if value is None:
    return None
  return value.string_value.decode(errors="replace")


def _weight(raw: str | None) -> float:
  if raw is None:
    return 1.0
  try:
    weight = float(raw)
  except ValueError:
    weight = -1.0
  if not 0 < weight < float("inf"):
    raise invalid_argument(
        f"weight={raw!r}: a client's weight is a positive number")
  return weight
