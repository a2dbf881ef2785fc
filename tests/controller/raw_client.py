"""RawSession: an IfrtSession spoken raw over gRPC, request by request, as
a foreign or hostile client would; every wait is bounded. Also the raw
host-buffer calls. Used by the tests' fixtures and by client processes the
tests start (tests/failure/churner.py)."""
from __future__ import annotations

import queue
import threading
from typing import Iterable

import grpc

from jax_pathways import dtypes
from jax_pathways.programs import sharding as sharding_lib
from jax_pathways.programs.sharding import Sharding
from jax_pathways.wire import protos

SERVICE = "/xla.ifrt.proxy.GrpcIfrtService/"
SESSION = SERVICE + "IfrtSession"
METADATA = "ifrt-proxy-grpc-ifrt-session-metadata-bin"
STORE_METADATA = "ifrt-proxy-grpc-host-buffer-store-metadata-bin"


def store(channel: grpc.Channel, session: int, handle: int,
          chunks: list[bytes], size: int | None = None):
  """HostBufferStore of `chunks` (announcing `size` bytes, by default their
  total) as host buffer `handle` of `session`."""
  return store_async(channel, session, handle, chunks, size).result(
      timeout=10)


def store_async(channel: grpc.Channel, session: int, handle: int,
                chunks: Iterable[bytes], size: int | None = None
                ) -> grpc.Future:
  """store(), its chunks sent as the iterable gives them: the call's
  future."""
  msg = protos.msg
  if size is None:
    chunks = list(chunks)
    size = sum(len(c) for c in chunks)
  meta = msg("xla.ifrt.proxy.GrpcHostBufferStoreMetadata")(
      session_id=session, handle=handle, buffer_size=size)
  request = msg("xla.ifrt.proxy.GrpcHostBufferStoreRequest")
  call = channel.stream_unary(
      SERVICE + "HostBufferStore",
      request_serializer=request.SerializeToString,
      response_deserializer=msg(
          "xla.ifrt.proxy.GrpcHostBufferStoreResponse").FromString)
  return call.future((request(data=c) for c in chunks), timeout=10,
                     metadata=[(STORE_METADATA, meta.SerializeToString())])


def lookup(channel: grpc.Channel, session: int, handle: int) -> bytes:
  """HostBufferLookup: the whole host buffer."""
  msg = protos.msg
  call = channel.unary_stream(
      SERVICE + "HostBufferLookup",
      request_serializer=msg(
          "xla.ifrt.proxy.GrpcHostBufferLookupRequest").SerializeToString,
      response_deserializer=msg(
          "xla.ifrt.proxy.GrpcHostBufferLookupResponse").FromString)
  return b"".join(r.data for r in call(
      msg("xla.ifrt.proxy.GrpcHostBufferLookupRequest")(
          session_id=session, handle=handle), timeout=10))


def delete(channel: grpc.Channel, session: int, handle: int):
  """HostBufferDelete."""
  msg = protos.msg
  call = channel.unary_unary(
      SERVICE + "HostBufferDelete",
      request_serializer=msg(
          "xla.ifrt.proxy.GrpcHostBufferDeleteRequest").SerializeToString,
      response_deserializer=msg(
          "xla.ifrt.proxy.GrpcHostBufferDeleteResponse").FromString)
  return call(msg("xla.ifrt.proxy.GrpcHostBufferDeleteRequest")(
      session_id=session, handle=handle), timeout=10)


class RawSession:
  """One open session; `call` sends one request and waits for its reply."""

  def __init__(self, address: str, token: str | None, timeout: float = 20.0,
               devices: str | None = None):
    meta = protos.msg("xla.ifrt.proxy.GrpcIfrtSessionMetadata")()
    meta.version.protocol_version = 25
    meta.version.ifrt_serdes_version_number = 3
    attributes = meta.initialization_data.attributes
    if token:
      attributes["jax_pathways_token"].string_value = token.encode()
    if devices:  # the slice asked for, as initialize(devices=...) asks
      attributes["jax_pathways_devices"].string_value = devices.encode()
    self._timeout = timeout
    self.error: grpc.RpcError | None = None  # how the stream ended, if not OK
    self._channel = grpc.insecure_channel(address.split("://")[1])
    request = protos.msg("xla.ifrt.proxy.IfrtRequest")
    stream = self._channel.stream_stream(
        SESSION,
        # Raw bytes pass as they are: what a hostile client would send.
        request_serializer=lambda r: (
            r if isinstance(r, bytes) else request.SerializeToString(r)),
        response_deserializer=protos.msg(
            "xla.ifrt.proxy.IfrtResponse").FromString)
    self._requests: queue.Queue = queue.Queue()
    self._replies: dict[int, object] = {}
    self._arrived = threading.Condition()
    self._op_id = 0
    self._responses = stream(iter(self._requests.get, None), timeout=120,
                             metadata=[(METADATA, meta.SerializeToString())])
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()
    self.id = self.call(init_request=lambda b: None).init_response.session_id

  def _read(self) -> None:
    try:
      for r in self._responses:
        with self._arrived:
          self._replies[r.response_metadata.op_id] = r
          self._arrived.notify_all()
    except grpc.RpcError as e:
      self.error = e

  def call(self, **kind):
    """Sends one request (kind=lambda body: fill it) and returns the reply."""
    return self.wait(self.send(**kind))

  def send(self, **kind) -> int:
    """Sends one request without waiting; returns its op_id."""
    self._op_id += 1
    req = protos.msg("xla.ifrt.proxy.IfrtRequest")()
    req.request_metadata.op_id = self._op_id
    for name, fill in kind.items():
      body = getattr(req, name)
      body.SetInParent()
      fill(body)
    self._requests.put(req)
    return self._op_id

  @property
  def next_op_id(self) -> int:
    return self._op_id + 1

  def send_raw(self, data: bytes) -> int:
    """Sends bytes as the next request (they may not even parse)."""
    self._op_id += 1
    self._requests.put(data)
    return self._op_id

  def wait(self, op_id: int):
    """The reply to `op_id`, within the session's timeout."""
    with self._arrived:
      if not self._arrived.wait_for(lambda: op_id in self._replies,
                                    self._timeout):
        raise AssertionError(f"no reply to op {op_id} within "
                             f"{self._timeout} s")
      return self._replies.pop(op_id)

  def store(self, handle: int, data: bytes) -> None:
    """Uploads `data` as this session's host buffer `handle`."""
    store(self._channel, self.id, handle, [data])

  def lookup(self, handle: int) -> bytes:
    return lookup(self._channel, self.id, handle)

  def send_make_array(self, host_buffer: int, array: int, n: int,
                      devices: tuple[int, ...] = (0,)) -> int:
    """MakeArrayFromHostBuffer of n float32 on (virtual) device 0, or
    replicated over `devices`."""

    def fill(body):
      body.host_buffer_handle = host_buffer
      body.array_handle = array
      dtypes.to_proto("float32", body.dtype)
      body.shape.dims.append(n)
      sharding_lib.to_proto(Sharding(devices, None, None), body.sharding)

    return self.send(make_array_from_host_buffer_request=fill)

  def fetch(self, array: int, host_buffer: int) -> bytes:
    """CopyToHostBuffer, then the bytes."""
    r = self.call(copy_to_host_buffer_request=lambda b: (
        setattr(b, "array_handle", array),
        setattr(b, "host_buffer_handle", host_buffer)))
    assert r.response_metadata.status.code == 0, r
    return self.lookup(host_buffer)

  def half_close(self) -> None:
    """No more requests; replies still arrive until the server ends."""
    self._requests.put(None)

  def ended(self, timeout: float) -> bool:
    """Whether the server ended the stream within `timeout`."""
    self._reader.join(timeout)
    return not self._reader.is_alive()

  def answered(self) -> set[int]:
    with self._arrived:
      return set(self._replies)

  def close(self) -> None:
    self._requests.put(None)
    self._reader.join(timeout=10)
    self._channel.close()
