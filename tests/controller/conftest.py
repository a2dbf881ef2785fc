"""raw_session: an IfrtSession spoken raw over gRPC, request by request, as
a foreign or hostile client would; every wait is bounded."""
from __future__ import annotations

import queue
import threading

import grpc
import pytest

from jax_pathways import protos

SESSION = "/xla.ifrt.proxy.GrpcIfrtService/IfrtSession"
METADATA = "ifrt-proxy-grpc-ifrt-session-metadata-bin"


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
    self._channel = grpc.insecure_channel(address.split("://")[1])
    stream = self._channel.stream_stream(
        SESSION,
        request_serializer=protos.msg(
            "xla.ifrt.proxy.IfrtRequest").SerializeToString,
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
    except grpc.RpcError:
      pass

  def call(self, **kind):
    """Sends one request (kind=lambda body: fill it) and returns the reply."""
    self._op_id += 1
    op_id = self._op_id
    req = protos.msg("xla.ifrt.proxy.IfrtRequest")()
    req.request_metadata.op_id = op_id
    for name, fill in kind.items():
      body = getattr(req, name)
      body.SetInParent()
      fill(body)
    self._requests.put(req)
    with self._arrived:
      if not self._arrived.wait_for(lambda: op_id in self._replies,
                                    self._timeout):
        raise AssertionError(f"no reply to op {op_id} within "
                             f"{self._timeout} s")
      return self._replies.pop(op_id)

  def close(self) -> None:
    self._requests.put(None)
    self._reader.join(timeout=10)
    self._channel.close()


@pytest.fixture
def raw_session(pathways):
  """Opens RawSessions on the test cluster; closes them afterwards."""
  opened = []

  def open_one(token: str | None = None,
               devices: str | None = None) -> RawSession:
    session = RawSession(pathways.address,
                         pathways.token if token is None else token,
                         devices=devices)
    opened.append(session)
    return session

  yield open_one
  for session in opened:
    session.close()
