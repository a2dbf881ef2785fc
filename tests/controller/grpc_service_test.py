"""Malformed or hostile requests get clear statuses; the controller keeps
serving. Spoken raw over gRPC, as a buggy or foreign client would."""
import os
import threading
import time
from typing import Iterator

import grpc
import pytest

import cli_cluster
import processes

from jax_pathways.wire import protos

pytestmark = pytest.mark.integration

SESSION = "/xla.ifrt.proxy.GrpcIfrtService/IfrtSession"
TOKEN = "first-message-test-token"


def _version():
  v = protos.msg("xla.ifrt.proxy.IfrtProxyVersion")()
  v.protocol_version, v.ifrt_serdes_version_number = 25, 3
  return v


def _session(pathways, requests, token=None):
  """Sends `requests` (messages or raw bytes) on one session; returns the
  replies by op_id."""
  meta = protos.msg("xla.ifrt.proxy.GrpcIfrtSessionMetadata")()
  meta.version.CopyFrom(_version())
  token = pathways.token if token is None else token
  if token:
    meta.initialization_data.attributes["jax_pathways_token"].string_value = (
        token.encode())
  req_cls = protos.msg("xla.ifrt.proxy.IfrtRequest")
  resp_cls = protos.msg("xla.ifrt.proxy.IfrtResponse")
  with grpc.insecure_channel(pathways.address.split("://")[1]) as channel:
    call = channel.stream_stream(
        SESSION, request_serializer=lambda r: (
            r if isinstance(r, bytes) else req_cls.SerializeToString(r)),
        response_deserializer=resp_cls.FromString)
    responses = call(iter(requests), timeout=20, metadata=[
        ("ifrt-proxy-grpc-ifrt-session-metadata-bin",
         meta.SerializeToString())])
    return {r.response_metadata.op_id: r for r in responses}


def _request(op_id, **kind):
  req = protos.msg("xla.ifrt.proxy.IfrtRequest")()
  req.request_metadata.op_id = op_id
  for name, fill in kind.items():
    body = getattr(req, name)
    body.SetInParent()
    fill(body)
  return req


def test_bad_requests_get_statuses_not_crashes(pathways):
  reqs = [
      _request(1),  # no operation at all
      _request(2, loaded_executable_execute_request=lambda b: setattr(
          b, "loaded_executable_handle", 12345)),
      _request(3, check_value_ready_request=lambda b: b.value_handles.append(77)),
      _request(4, loaded_executable_cost_analysis_request=lambda b: setattr(
          b, "loaded_executable_handle", 99)),
      _request(5, get_default_device_assignment_request=lambda b: (
          setattr(b, "num_replicas", 1), setattr(b, "num_partitions", 1000))),
      _request(6, compile_request=lambda b: setattr(
          b.program, "type_name", "xla::ifrt::Mystery")),
      _request(7, check_future_request=lambda b: setattr(b, "future_handle", 5)),
      _request(8, init_request=lambda b: None),
  ]
  got = _session(pathways, reqs)
  assert set(got) == set(range(1, 9))
  assert got[1].response_metadata.status.code == 3
  assert got[2].response_metadata.status.code == 5
  assert "loaded executable handle: 12345" in got[2].response_metadata.status.message
  assert got[3].response_metadata.status.code == 5
  # CostAnalysis always carries a body (an empty one crashes jaxlib 0.10.2).
  assert got[4].WhichOneof("response") == "loaded_executable_cost_analysis_response"
  assert got[4].loaded_executable_cost_analysis_response.status.code == 5
  assert "1000 partitions" in got[5].response_metadata.status.message
  assert got[6].response_metadata.status.code == 12
  assert "Mystery" in got[6].response_metadata.status.message
  assert got[7].response_metadata.status.code == 5
  init = got[8].init_response
  assert len(init.all_devices) == 8 and init.process_index == 0
  for r in got.values():  # an error reply never carries a body
    if r.response_metadata.status.code:
      assert r.WhichOneof("response") is None


def test_wrong_token_is_refused(pathways):
  with pytest.raises(grpc.RpcError) as e:
    _session(pathways, [_request(1, init_request=lambda b: None)],
             token="not-the-token")
  assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


def _refused_stream(pathways, requests):
  """The replies and the final status of a session with a wrong token."""
  meta = protos.msg("xla.ifrt.proxy.GrpcIfrtSessionMetadata")()
  meta.version.CopyFrom(_version())
  with grpc.insecure_channel(pathways.address.split("://")[1]) as channel:
    call = channel.stream_stream(
        SESSION, response_deserializer=protos.msg(
            "xla.ifrt.proxy.IfrtResponse").FromString)(
                requests, timeout=30, metadata=[(
                    "ifrt-proxy-grpc-ifrt-session-metadata-bin",
                    meta.SerializeToString())])
    replies = []
    with pytest.raises(grpc.RpcError) as e:
      for reply in call:
        replies.append(reply)
    return replies, e.value


def test_refused_init_request_carries_the_reason(pathways):
  """JAX's client shows its InitRequest's status (it cancels the stream
  before reading how the server ended it); the request is answered
  unread (JAX's client numbers it 1)."""
  init = _request(1, init_request=lambda b: None).SerializeToString()
  stay = threading.Event()

  def requests():
    yield init
    stay.wait(30)  # the server ends the stream, not this client

  try:
    replies, error = _refused_stream(pathways, requests())
  finally:
    stay.set()
  assert error.code() == grpc.StatusCode.UNAUTHENTICATED
  [reply] = replies
  assert reply.response_metadata.op_id == 1
  assert reply.response_metadata.status.code == 16  # UNAUTHENTICATED
  assert "jax-pathways connect" in reply.response_metadata.status.message
  assert reply.WhichOneof("response") is None  # no devices, nothing else


def test_refused_silent_stream_is_ended(pathways):
  stay = threading.Event()

  def requests():
    stay.wait(30)
    yield b""

  try:
    _, error = _refused_stream(pathways, requests())
  finally:
    stay.set()
  # By the server (its client's own timeout, 30 s, would be
  # DEADLINE_EXCEEDED).
  assert error.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_refused_stream_costs_no_memory(pathways):
  """Frames sent before the token is accepted are never read: 8 x 128 MiB
  grew the controller from 71 to 525 MiB at 52b5207."""
  frame = b"\0" * (128 << 20)
  controller = pathways.controller.pid
  before = processes.rss(controller)
  _, error = _refused_stream(pathways, iter([frame] * 8))
  assert error.code() == grpc.StatusCode.UNAUTHENTICATED
  grown = processes.rss(controller) - before
  print(f"controller grew {grown / 2**20:.1f} MiB for 8 x 128 MiB refused")
  assert grown < 64 << 20, grown


def test_controller_still_serves_jax(pathways, proxy_devices):
  import jax
  import numpy as np
  y = jax.jit(lambda a: a * 3)(jax.device_put(np.arange(3.0), proxy_devices[1]))
  np.testing.assert_array_equal(np.asarray(y), [0.0, 3.0, 6.0])


def _raw_call(pathways, method, data, metadata=()):
  """Sends raw bytes to `method`; returns the reply's bytes or raises."""
  with grpc.insecure_channel(pathways.address.split("://")[1]) as channel:
    return channel.unary_unary(method)(data, timeout=10, metadata=metadata)


def test_garbage_is_answered_and_changes_nothing(pathways, proxy_devices):
  # At 385bf6b none of these was ever answered (the caller waited forever;
  # an unparsable session stayed open and the controller kept reading it).
  garbage = [b"\xff" * 7, b"\x0a\xff\xff\xff\xff\xff\x01", bytes(range(256))]
  for data in garbage:
    with pytest.raises(grpc.RpcError) as e:
      _raw_call(pathways, "/xla.ifrt.proxy.GrpcIfrtService/GetVersion", data)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == "jax_pathways: unparsable GetVersion request"

    with grpc.insecure_channel(pathways.address.split("://")[1]) as channel:
      responses = channel.stream_stream(SESSION)(
          iter([b"\x08\x01"]), timeout=10,
          metadata=[("ifrt-proxy-grpc-ifrt-session-metadata-bin", data)])
      with pytest.raises(grpc.RpcError) as e:
        list(responses)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == "jax_pathways: unparsable session metadata"

  # A valid session sending an unparsable request loses its stream only.
  with pytest.raises(grpc.RpcError) as e:
    _session(pathways, [_request(1, init_request=lambda b: None),
                        b"\xff\xff\xff"])
  assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
  assert e.value.details() == "jax_pathways: unparsable IfrtRequest"
  test_controller_still_serves_jax(pathways, proxy_devices)


@pytest.fixture(name="impatient")
def _impatient() -> Iterator[str]:
  """A controller of its own (no worker needed) whose first-message
  timeout is 1 s (JAX_PATHWAYS_FIRST_MESSAGE_TIMEOUT); its address."""
  env = dict(os.environ, JAX_PATHWAYS_TOKEN=TOKEN,
             JAX_PATHWAYS_FIRST_MESSAGE_TIMEOUT="1")
  procs = [cli_cluster.spawn("controller", "--islands", "1", "--listen",
                             "127.0.0.1:0", "--worker-listen", "127.0.0.1:0",
                             env=env)]
  try:
    yield cli_cluster.line(procs[0], 60)["address"]
  finally:
    processes.stop(procs)


def test_a_call_that_never_sends_its_request_is_cut_off(impatient):
  """Cut off by the server (CANCELLED) after its first-message timeout,
  well before the client's own deadline (DEADLINE_EXCEEDED). At 385bf6b
  such a call stayed open as long as the client liked; a session with the
  right token but no InitRequest did until 2026-11 (it held a thread of
  `jax-pathways connect`, which forwards it, too)."""
  never = threading.Event()
  target = impatient
  ended: dict[str, grpc.StatusCode | str] = {}
  meta = protos.msg("xla.ifrt.proxy.GrpcIfrtSessionMetadata")()
  meta.version.CopyFrom(_version())
  meta.initialization_data.attributes["jax_pathways_token"].string_value = (
      TOKEN.encode())

  def silent():
    never.wait(60)
    yield b""

  def call(method: str) -> None:
    metadata = ([("ifrt-proxy-grpc-ifrt-session-metadata-bin",
                  meta.SerializeToString())]
                if method == "IfrtSession" else [])
    with grpc.insecure_channel(target) as channel:
      stream = channel.stream_stream(
          f"/xla.ifrt.proxy.GrpcIfrtService/{method}")
      try:
        list(stream(silent(), timeout=50, metadata=metadata))
        ended[method] = "answered"
      except grpc.RpcError as e:
        ended[method] = e.code()

  methods = ("GetVersion", "HostBufferLookup", "HostBufferDelete",
             "IfrtSession")
  threads = [threading.Thread(target=call, args=(m,)) for m in methods]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=70)
  never.set()
  assert ended == {m: grpc.StatusCode.CANCELLED for m in methods}