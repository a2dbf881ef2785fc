"""Forwarder: a local socket that adds the cluster token to IFRT-proxy calls.

`jax-pathways connect` runs one, for JAX clients that cannot send the token
themselves (pathwaysutils: JAX_PLATFORMS=proxy, JAX_BACKEND_TARGET). It
listens on a Unix socket in a folder only its user may enter (0700), passes
every GrpcIfrtService call on to the controller as raw bytes, and puts the
token into each IfrtSession's metadata on the way. Host-buffer calls need no
token (the controller checks their secret session id). A call ends on both
sides when either side ends it; nothing it forwards is parsed but the
session metadata, and metadata it cannot parse is refused, not forwarded.
"""
from __future__ import annotations

import concurrent.futures
import os
import stat
import tempfile
import threading
from typing import Any, Iterator

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
  """GrpcIfrtService calls, passed on to `controller` as raw bytes."""

  def __init__(self, controller: str, token: str,
               first_message_timeout: float):
    """A session that has not sent its InitRequest within
    `first_message_timeout` seconds is ended: each holds one of the
    forwarder's threads, and idle ones must not lock others out."""
    self._token = token
    self._first_message_timeout = first_message_timeout
    self._channel = grpc.insecure_channel(controller, options=_OPTIONS)

  def close(self) -> None:
    self._channel.close()

  def service(self, details: Any) -> grpc.RpcMethodHandler | None:
    name = details.method[len(SERVICE):]
    if not details.method.startswith(SERVICE) or name not in METHODS:
      return None  # gRPC answers UNIMPLEMENTED
    streams_in, streams_out = METHODS[name]
    kind = {(False, False): "unary_unary", (True, True): "stream_stream",
            (True, False): "stream_unary", (False, True): "unary_stream"}[
                (streams_in, streams_out)]
    upstream = getattr(self._channel, kind)(details.method)

    def forward(request: Any, context: grpc.ServicerContext) -> Any:
      metadata = self._metadata(name, context)
      if streams_out:
        return self._stream(upstream, request, metadata, context)
      future = upstream.future(request, metadata=metadata,
                               timeout=None if streams_in else UNARY_TIMEOUT_S)
      context.add_callback(future.cancel)
      try:
        return future.result()
      except grpc.RpcError as e:
        context.abort(e.code(), e.details() or "")
      except grpc.FutureCancelledError:
        context.abort(grpc.StatusCode.CANCELLED, "the client left")

    return getattr(grpc, f"{kind}_rpc_method_handler")(forward)

  def _metadata(self, name: str, context: grpc.ServicerContext
                ) -> list[tuple[str, Any]]:
    metadata = []
    for key, value in context.invocation_metadata():
      if key.startswith(_SKIPPED_METADATA):
        continue
      if name == "IfrtSession" and key == SESSION_METADATA:
        try:
          value = with_token(value, self._token)
        except Exception:  # pylint: disable=broad-except
          context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                        "jax-pathways connect: unparsable session metadata")
      metadata.append((key, value))
    return metadata

  def _stream(self, upstream: Any, request: Any,
              metadata: list[tuple[str, Any]],
              context: grpc.ServicerContext) -> Iterator[bytes]:
    first, silent = threading.Event(), threading.Event()
    if isinstance(request, Iterator):  # a session's requests

      def requests() -> Iterator[bytes]:
        # A client that ends its session cancels its stream, and reading
        # on raises; left to gRPC that is logged as a failure with a
        # traceback ("Exception iterating requests!"). The call below is
        # cancelled with it.
        try:
          for r in request:
            first.set()
            yield r
        except grpc.RpcError:
          return

      def cut() -> None:
        if not first.is_set():
          silent.set()
          call.cancel()

      call = upstream(requests(), metadata=metadata)
      timer = threading.Timer(self._first_message_timeout, cut)
      timer.daemon = True
      timer.start()
      context.add_callback(timer.cancel)
    else:
      call = upstream(request, metadata=metadata)
    context.add_callback(call.cancel)  # the client left: so does the call
    try:
      yield from call
    except grpc.RpcError as e:
      if silent.is_set():
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                      f"jax-pathways connect: no first request within "
                      f"{self._first_message_timeout:g} s")
      context.abort(e.code(), e.details() or "")


def serve(controller: str, token: str, path: str, max_workers: int = 64,
          first_message_timeout: float = config.DEFAULT_FIRST_MESSAGE_TIMEOUT
          ) -> tuple[grpc.Server, Forwarder]:
  """Starts a Forwarder on the Unix socket `path` (whose folder must be
  private); stop it with server.stop(grace) and forwarder.close()."""
  check_private(path)
  forwarder = Forwarder(controller, token, first_message_timeout)
  # A session holds a thread for its lifetime (its request and reply
  # streams), so the pool bounds the sessions one forwarder carries.
  server = grpc.server(
      concurrent.futures.ThreadPoolExecutor(max_workers=max_workers,
                                            thread_name_prefix="jp-connect"),
      handlers=[forwarder], options=_OPTIONS,
      maximum_concurrent_rpcs=max_workers)  # beyond: RESOURCE_EXHAUSTED
  if not server.add_insecure_port(f"unix:{path}"):
    forwarder.close()
    raise OSError(f"cannot listen on unix:{path}")
  server.start()
  logging.info("forwarding unix:%s to %s", path, controller)
  return server, forwarder
