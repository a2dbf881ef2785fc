"""GrpcService: the controller's gRPC face, and nothing else.

Serves xla.ifrt.proxy.GrpcIfrtService (GetVersion, IfrtSession, HostBuffer*)
with messages from jaxlib's own schema, plus jax_pathways.Admin/Status for
`jax-pathways status`. Sessions do the work; this module only moves
messages, checks the cluster token and cleans up when a stream ends.
"""
from __future__ import annotations

import itertools
import json
import secrets
import threading
from concurrent import futures
from typing import Any, Callable, Iterator

from absl import logging
import grpc

from jax_pathways import protos
from jax_pathways.controller import versions
from jax_pathways.controller.handlers import HANDLERS, RESULT_HANDLES
from jax_pathways.controller.session import Services, Session
from jax_pathways.status import Code, StatusError

SERVICE = "xla.ifrt.proxy.GrpcIfrtService"
ADMIN_SERVICE = "jax_pathways.Admin"
SESSION_METADATA = "ifrt-proxy-grpc-ifrt-session-metadata-bin"
STORE_METADATA = "ifrt-proxy-grpc-host-buffer-store-metadata-bin"
# The key a client puts its cluster token under (session initialization data,
# or gRPC metadata for the admin service).
TOKEN_KEY = "jax_pathways_token"
ADMIN_TOKEN_HEADER = "jax-pathways-token"
_CHUNK = 1 << 20
_END = object()

_GRPC_CODES = {c.value[0]: c for c in grpc.StatusCode}


def _grpc_code(code: int) -> grpc.StatusCode:
  return _GRPC_CODES.get(int(code), grpc.StatusCode.UNKNOWN)


class GrpcService:
  """Implements the IFRT-proxy service over Services."""

  def __init__(self, services: Services, token: str | None,
               status: Callable[[], dict[str, Any]]):
    self.services = services
    self._token = token
    self._status = status
    # Session ids name a session's host buffers; random, so one client
    # cannot guess another's.
    self._lock = threading.Lock()
    self.sessions: dict[int, Session] = {}
    self._counter = itertools.count(1)

  # ------------------------------------------------------------- GetVersion
  def get_version(self, req: Any, context: grpc.ServicerContext) -> Any:
    try:
      protocol, serdes = versions.negotiate(req.min_version, req.max_version)
    except StatusError as e:
      context.abort(_grpc_code(e.status.code), e.status.message)
    resp = protos.msg("xla.ifrt.proxy.GrpcGetVersionResponse")()
    resp.version.protocol_version = protocol
    resp.version.ifrt_serdes_version_number = serdes
    return resp

  # ------------------------------------------------------------ IfrtSession
  def ifrt_session(self, requests: Iterator[Any],
                   context: grpc.ServicerContext) -> Iterator[Any]:
    metadata = dict(context.invocation_metadata())
    raw = metadata.get(SESSION_METADATA)
    if raw is None:
      context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                    "IfrtSession without session metadata")
    meta = protos.msg("xla.ifrt.proxy.GrpcIfrtSessionMetadata").FromString(raw)
    if not self._token_ok(meta):
      context.abort(grpc.StatusCode.UNAUTHENTICATED,
                    "jax_pathways: wrong or missing cluster token; pass "
                    "jax_pathways.initialize(address, token=...) or set "
                    "JAX_PATHWAYS_TOKEN")
    version = meta.version.protocol_version
    if not (versions.MIN_PROTOCOL_VERSION <= version <=
            versions.MAX_PROTOCOL_VERSION):
      context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                    f"protocol version {version} is not supported")
    session_id = secrets.randbits(62) | 1
    session = Session(session_id, version, self.services, HANDLERS,
                      RESULT_HANDLES)
    with self._lock:
      self.sessions[session_id] = session
    logging.info("session %d opened (protocol %d, peer %s)", session_id,
                 version, context.peer())
    context.add_callback(lambda: session.outbox.put(_END))

    def read() -> None:
      try:
        for request in requests:
          session.handle(request)
      except grpc.RpcError:
        pass  # the client went away; the callback above ends the stream
      except Exception:  # pylint: disable=broad-except
        logging.exception("session %d reader failed", session_id)
      session.outbox.put(_END)

    reader = threading.Thread(target=read, name=f"session-{session_id}",
                              daemon=True)
    reader.start()
    try:
      while True:
        item = session.outbox.get()
        if item is _END:
          return
        yield item
    finally:
      with self._lock:
        self.sessions.pop(session_id, None)
      session.close()
      logging.info("session %d closed", session_id)

  def _token_ok(self, meta: Any) -> bool:
    if not self._token:
      return True
    value = meta.initialization_data.attributes.get(TOKEN_KEY)
    given = value.string_value.decode() if value is not None else ""
    return secrets.compare_digest(given, self._token)

  # ------------------------------------------------------------ host buffers
  def host_buffer_store(self, chunks: Iterator[Any],
                        context: grpc.ServicerContext) -> Any:
    metadata = dict(context.invocation_metadata())
    raw = metadata.get(STORE_METADATA)
    if raw is None:
      context.abort(grpc.StatusCode.INTERNAL,
                    "HostBufferStore without its metadata header")
    try:
      meta = protos.msg("xla.ifrt.proxy.GrpcHostBufferStoreMetadata"
                        ).FromString(raw)
    except Exception:  # pylint: disable=broad-except
      context.abort(grpc.StatusCode.DATA_LOSS, "unparsable store metadata")
    data = b"".join(c.data for c in chunks)
    if len(data) != meta.buffer_size:
      context.abort(grpc.StatusCode.DATA_LOSS,
                    f"host buffer {meta.handle}: got {len(data)} bytes, "
                    f"expected {meta.buffer_size}")
    try:
      self.services.host_buffers.store(meta.session_id, meta.handle, data)
    except StatusError as e:
      context.abort(_grpc_code(e.status.code), e.status.message)
    return protos.msg("xla.ifrt.proxy.GrpcHostBufferStoreResponse")()

  def host_buffer_lookup(self, req: Any, context: grpc.ServicerContext
                         ) -> Iterator[Any]:
    try:
      data = self.services.host_buffers.lookup(req.session_id, req.handle)
    except StatusError as e:
      context.abort(_grpc_code(e.status.code), e.status.message)
    cls = protos.msg("xla.ifrt.proxy.GrpcHostBufferLookupResponse")
    view = memoryview(data)
    yield cls(data=bytes(view[:_CHUNK]))  # at least one message
    for i in range(_CHUNK, len(view), _CHUNK):
      yield cls(data=bytes(view[i:i + _CHUNK]))

  def host_buffer_delete(self, req: Any, context: grpc.ServicerContext) -> Any:
    try:
      self.services.host_buffers.delete(req.session_id, req.handle)
    except StatusError as e:
      context.abort(_grpc_code(e.status.code), e.status.message)
    return protos.msg("xla.ifrt.proxy.GrpcHostBufferDeleteResponse")()

  def host_buffer_read_from_disk(self, req: Any,
                                 context: grpc.ServicerContext) -> Any:
    context.abort(grpc.StatusCode.UNIMPLEMENTED,
                  "jax_pathways does not read host buffers from disk; unset "
                  "IFRT_PROXY_GRPC_LARGE_TRANSFER_OPTIMIZATION_DIRECTORY")

  # ------------------------------------------------------------------ admin
  def admin_status(self, req: bytes, context: grpc.ServicerContext) -> bytes:
    if self._token:
      given = dict(context.invocation_metadata()).get(ADMIN_TOKEN_HEADER, "")
      if not secrets.compare_digest(given, self._token):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "wrong cluster token")
    return json.dumps(self._status()).encode()


def build_server(service: GrpcService, bind: str, max_workers: int = 256
                 ) -> tuple[grpc.Server, int]:
  """A started-ready (not started) server bound to `bind` ('host:port')."""
  m = protos.msg

  def unary(fn, req, resp):
    return grpc.unary_unary_rpc_method_handler(
        fn, request_deserializer=req.FromString,
        response_serializer=resp.SerializeToString)

  handlers = {
      "GetVersion": unary(service.get_version,
                          m("xla.ifrt.proxy.GrpcGetVersionRequest"),
                          m("xla.ifrt.proxy.GrpcGetVersionResponse")),
      "IfrtSession": grpc.stream_stream_rpc_method_handler(
          service.ifrt_session,
          request_deserializer=m("xla.ifrt.proxy.IfrtRequest").FromString,
          response_serializer=m("xla.ifrt.proxy.IfrtResponse").SerializeToString),
      "HostBufferStore": grpc.stream_unary_rpc_method_handler(
          service.host_buffer_store,
          request_deserializer=m(
              "xla.ifrt.proxy.GrpcHostBufferStoreRequest").FromString,
          response_serializer=m(
              "xla.ifrt.proxy.GrpcHostBufferStoreResponse").SerializeToString),
      "HostBufferLookup": grpc.unary_stream_rpc_method_handler(
          service.host_buffer_lookup,
          request_deserializer=m(
              "xla.ifrt.proxy.GrpcHostBufferLookupRequest").FromString,
          response_serializer=m(
              "xla.ifrt.proxy.GrpcHostBufferLookupResponse").SerializeToString),
      "HostBufferDelete": unary(
          service.host_buffer_delete,
          m("xla.ifrt.proxy.GrpcHostBufferDeleteRequest"),
          m("xla.ifrt.proxy.GrpcHostBufferDeleteResponse")),
      "HostBufferReadFromDisk": unary(
          service.host_buffer_read_from_disk,
          m("xla.ifrt.proxy.GrpcHostBufferReadFromDiskRequest"),
          m("xla.ifrt.proxy.GrpcHostBufferReadFromDiskResponse")),
  }
  admin = {
      "Status": grpc.unary_unary_rpc_method_handler(
          service.admin_status, request_deserializer=None,
          response_serializer=None),
  }
  server = grpc.server(
      futures.ThreadPoolExecutor(max_workers=max_workers,
                                 thread_name_prefix="grpc"),
      options=[("grpc.max_receive_message_length", -1),
               ("grpc.max_send_message_length", -1),
               ("grpc.so_reuseport", 0)])
  server.add_generic_rpc_handlers((
      grpc.method_handlers_generic_handler(SERVICE, handlers),
      grpc.method_handlers_generic_handler(ADMIN_SERVICE, admin),
  ))
  port = server.add_insecure_port(bind)
  if port == 0:
    raise OSError(f"could not bind the controller to {bind}")
  return server, port
