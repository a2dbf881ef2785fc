"""Forwarder: a local socket that adds the cluster token to IFRT-proxy calls.

`jax-pathways connect` runs one, for JAX clients that cannot send the token
themselves (pathwaysutils: JAX_PLATFORMS=proxy, JAX_BACKEND_TARGET). It
listens on a Unix socket in a folder only its user may enter (0700), passes
every GrpcIfrtService call on to the controller as raw bytes, and puts the
token into each IfrtSession's metadata on the way. Host-buffer calls need no
token (the controller checks their secret session id). A call ends on both
sides when either side ends it; nothing it forwards is parsed but the
session metadata, and metadata it cannot parse is refused, not forwarded.

It runs on asyncio (grpc.aio): a call costs a coroutine, not a thread, so
sessions are not bounded by a pool. What is bounded is the sessions that
have not sent their first request yet (a client sends its InitRequest at
once): each is ended after `first_message_timeout`, and when `max_pending`
wait, the oldest is ended to let a new one in, so streams left idle on
purpose (re-opened as fast as they are ended) never lock a real client out.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import os
import stat
import tempfile
import threading
from typing import Any, AsyncIterator

from absl import logging
import grpc

from jax_pathways import config
from jax_pathways.wire.session_keys import SESSION_METADATA, TOKEN_KEY
from jax_pathways.wire import protos

SERVICE = "/xla.ifrt.proxy.GrpcIfrtService/"
# Method -> (client streams, server streams), as in grpc_ifrt_service.proto.
METHODS = {"GetVersion": (False, False), "IfrtSession": (True, True),
           "HostBufferStore": (True, False), "HostBufferLookup": (False, True),
           "HostBufferDelete": (False, False)}
UNARY_TIMEOUT_S = 60.0  # GetVersion, HostBufferDelete
# Sessions waiting for their first request; more end the oldest.
MAX_PENDING = 256
STOP_TIMEOUT_S = 10.0
# Host buffers can be large; gRPC's default limit is 4 MiB.
_OPTIONS = [("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1)]
_SKIPPED_METADATA = ("user-agent", "grpc-")


def socket_dir() -> str:
  """A fresh folder only this user may enter, for the socket."""
  base = os.environ.get("XDG_RUNTIME_DIR") or None
  return tempfile.mkdtemp(prefix="jax_pathways_connect_", dir=base)


def check_private(path: str) -> None:
  """Refuses a socket path whose folder others may enter or is not ours:
  anyone who can reach the socket uses the cluster with our token."""
  folder = os.path.dirname(os.path.abspath(path))
  info = os.stat(folder)
  if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG |
                                                   stat.S_IRWXO):
    raise PermissionError(
        f"{folder} (mode {stat.filemode(info.st_mode)}, owner uid "
        f"{info.st_uid}) may be entered by others; the socket that carries "
        f"the cluster token needs a folder of its own with mode 0700 "
        f"(chmod 700 {folder}) or leave --listen out")


def with_token(raw: bytes, token: str) -> bytes:
  """Session metadata with the token among its initialization data."""
  meta = protos.msg("xla.ifrt.proxy.GrpcIfrtSessionMetadata").FromString(raw)
  meta.initialization_data.attributes[TOKEN_KEY].string_value = token.encode()
  return meta.SerializeToString()


class Forwarder(grpc.GenericRpcHandler):
  """GrpcIfrtService calls, passed on to `controller` as raw bytes (its
  handlers run on the server's event loop)."""

  def __init__(self, controller: str, token: str,
               first_message_timeout: float, max_pending: int = MAX_PENDING):
    """A session that has not sent its InitRequest within
    `first_message_timeout` seconds is ended, and so is the oldest of more
    than `max_pending` such sessions."""
    self._controller = controller
    self._token = token
    self._first_message_timeout = first_message_timeout
    self._max_pending = max_pending
    self._channel: grpc.aio.Channel | None = None  # made on the loop
    # Sessions without a first request, oldest first: the wait for it, and
    # why they were ended (None: not ended by us).
    self._pending: collections.OrderedDict[int, tuple[Any, list]] = (
        collections.OrderedDict())
    self._keys = itertools.count()

  async def open(self) -> None:
    self._channel = grpc.aio.insecure_channel(self._controller,
                                              options=_OPTIONS)

  async def close(self) -> None:
    if self._channel is not None:
      await self._channel.close()

  def service(self, details: Any) -> grpc.RpcMethodHandler | None:
    name = details.method[len(SERVICE):]
    if not details.method.startswith(SERVICE) or name not in METHODS:
      return None  # gRPC answers UNIMPLEMENTED
    streams_in, streams_out = METHODS[name]
    kind = {(False, False): "unary_unary", (True, True): "stream_stream",
            (True, False): "stream_unary", (False, True): "unary_stream"}[
                (streams_in, streams_out)]
    upstream = getattr(self._channel, kind)(details.method)
    if kind == "stream_stream":
      async def session(requests: Any, context: Any) -> AsyncIterator[bytes]:
        metadata = await self._metadata(name, context)
        async for r in self._session(upstream, requests, metadata, context):
          yield r
      return grpc.stream_stream_rpc_method_handler(session)
    if kind == "unary_stream":
      async def lookup(request: bytes, context: Any) -> AsyncIterator[bytes]:
        call = upstream(request, metadata=await self._metadata(name, context))
        async for r in _relay(call, context):
          yield r
      return grpc.unary_stream_rpc_method_handler(lookup)

    async def unary(request: Any, context: Any) -> bytes:
      call = upstream(request, metadata=await self._metadata(name, context),
                      timeout=None if streams_in else UNARY_TIMEOUT_S)
      try:
        return await call
      except grpc.aio.AioRpcError as e:
        await context.abort(e.code(), e.details() or "")
      finally:
        call.cancel()

    return getattr(grpc, f"{kind}_rpc_method_handler")(unary)

  async def _metadata(self, name: str, context: Any
                      ) -> list[tuple[str, Any]]:
    metadata = []
    for key, value in context.invocation_metadata():
      if key.startswith(_SKIPPED_METADATA):
        continue
      if name == "IfrtSession" and key == SESSION_METADATA:
        try:
          value = with_token(value, self._token)
        except Exception:  # pylint: disable=broad-except
          await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              "jax-pathways connect: unparsable session "
                              "metadata")
      metadata.append((key, value))
    return metadata

  async def _session(self, upstream: Any, requests: Any,
                     metadata: list[tuple[str, Any]], context: Any
                     ) -> AsyncIterator[bytes]:
    """One IfrtSession: pending (nothing upstream yet) until its first
    request, then forwarded."""
    key, why = next(self._keys), [None]
    incoming = requests.__aiter__()
    first = asyncio.ensure_future(incoming.__anext__())
    self._pending[key] = (first, why)
    if len(self._pending) > self._max_pending:
      _, (oldest, oldest_why) = self._pending.popitem(last=False)
      oldest_why[0] = (grpc.StatusCode.RESOURCE_EXHAUSTED,
                       f"jax-pathways connect: ended for a newer session: "
                       f"more than {self._max_pending} sessions were waiting "
                       "for their first request")
      oldest.cancel()
    timer = asyncio.get_running_loop().call_later(
        self._first_message_timeout, self._cut_if_pending, key)
    try:
      request = await first
    except StopAsyncIteration:
      return  # the client ended its session before asking anything
    except asyncio.CancelledError:
      if why[0] is None:
        raise  # the client left
      await context.abort(*why[0])
    finally:
      timer.cancel()
      self._pending.pop(key, None)

    async def forwarded() -> AsyncIterator[bytes]:
      yield request
      async for r in incoming:
        yield r

    async for r in _relay(upstream(forwarded(), metadata=metadata), context):
      yield r

  def _cut_if_pending(self, key: int) -> None:
    found = self._pending.pop(key, None)
    if found is not None:
      first, why = found
      why[0] = (grpc.StatusCode.DEADLINE_EXCEEDED,
                f"jax-pathways connect: no first request within "
                f"{self._first_message_timeout:g} s")
      first.cancel()


async def _relay(call: Any, context: Any) -> AsyncIterator[bytes]:
  """An upstream call's replies, then its status, to the client."""
  try:
    async for r in call:
      yield r
  except grpc.aio.AioRpcError as e:
    await context.abort(e.code(), e.details() or "")
  finally:
    call.cancel()


class Server:
  """A Forwarder's gRPC server, on an event loop of its own thread."""

  def __init__(self, forwarder: Forwarder, path: str):
    self._loop = asyncio.new_event_loop()
    self._forwarder = forwarder
    self._stopped = threading.Event()
    started: dict[str, BaseException] = {}
    ready = threading.Event()

    def run() -> None:
      asyncio.set_event_loop(self._loop)
      try:
        self._loop.run_until_complete(self._start(path, started))
      except BaseException as e:  # pylint: disable=broad-except
        started["error"] = e
      ready.set()
      if "error" not in started:
        self._loop.run_forever()
      self._loop.close()
      self._stopped.set()

    threading.Thread(target=run, name="jp-connect", daemon=True).start()
    ready.wait()
    if "error" in started:
      raise started["error"]

  async def _start(self, path: str, started: dict) -> None:
    await self._forwarder.open()
    self._server = grpc.aio.server(handlers=[self._forwarder],
                                   options=_OPTIONS)
    if not self._server.add_insecure_port(f"unix:{path}"):
      await self._forwarder.close()
      raise OSError(f"cannot listen on unix:{path}")
    await self._server.start()

  def stop(self, grace: float | None) -> threading.Event:
    """Stops serving (calls in flight get `grace` seconds); the event is
    set once the loop has ended."""
    async def stop() -> None:
      await self._server.stop(grace)
      await self._forwarder.close()
      # Calls still winding down end here, not with the loop.
      others = [t for t in asyncio.all_tasks()
                if t is not asyncio.current_task()]
      for task in others:
        task.cancel()
      await asyncio.gather(*others, return_exceptions=True)
      self._loop.stop()

    if not self._stopped.is_set():
      asyncio.run_coroutine_threadsafe(stop(), self._loop)
    return self._stopped


def serve(controller: str, token: str, path: str,
          max_pending: int = MAX_PENDING,
          first_message_timeout: float = config.DEFAULT_FIRST_MESSAGE_TIMEOUT
          ) -> Server:
  """Starts a Forwarder on the Unix socket `path` (whose folder must be
  private); stop it with stop(grace).wait(timeout)."""
  check_private(path)
  server = Server(Forwarder(controller, token, first_message_timeout,
                            max_pending), path)
  logging.info("forwarding unix:%s to %s", path, controller)
  return server
