"""Short sessions that end abruptly, replies still in flight, against a
controller over TCP: the controller survives every one and serves the next
client. (A Call used to start ops after its RPC was over and be freed with
them pending: SIGSEGV in the controller's gRPC thread after 1-200 sessions.)
tests/sanitizers/ runs it under ASan and TSan too."""
from __future__ import annotations

import os
import queue
import subprocess
import sys
import textwrap
import time

import grpc
import pytest

from jax_pathways.wire import protos

pytestmark = pytest.mark.integration

# Under ASan the old bug showed within 3-37 sessions, once not within 40.
RAW_SESSIONS = 150
JAX_SESSIONS = 2
SESSION = "/xla.ifrt.proxy.GrpcIfrtService/IfrtSession"
METADATA = "ifrt-proxy-grpc-ifrt-session-metadata-bin"

CLIENT = textwrap.dedent("""
    import sys
    import jax_pathways
    jax_pathways.initialize(sys.argv[1], token=sys.argv[2])
    import jax, jax.numpy as jnp
    print(float(jax.jit(jnp.sum)(jnp.arange(10.0))))
""")


def _request(op_id: int, **kind):
  req = protos.msg("xla.ifrt.proxy.IfrtRequest")()
  req.request_metadata.op_id = op_id
  for name, fill in kind.items():
    getattr(req, name).SetInParent()
    fill(getattr(req, name))
  return req


def _abrupt_session(address: str, token: str, n: int) -> None:
  """Opens a session, sends n requests and cancels the stream without
  waiting for their replies (after a delay that varies with n)."""
  meta = protos.msg("xla.ifrt.proxy.GrpcIfrtSessionMetadata")()
  meta.version.protocol_version = 25
  meta.version.ifrt_serdes_version_number = 3
  meta.initialization_data.attributes[
      "jax_pathways_token"].string_value = token.encode()
  with grpc.insecure_channel(address) as channel:
    stream = channel.stream_stream(
        SESSION,
        request_serializer=protos.msg(
            "xla.ifrt.proxy.IfrtRequest").SerializeToString,
        response_deserializer=protos.msg(
            "xla.ifrt.proxy.IfrtResponse").FromString)
    requests: queue.Queue = queue.Queue()
    requests.put(_request(1, init_request=lambda b: None))
    responses = stream(iter(requests.get, None), timeout=30,
                       metadata=[(METADATA, meta.SerializeToString())])
    assert next(responses).HasField("init_response")
    for op_id in range(2, n % 6 + 3):
      requests.put(_request(
          op_id, check_future_request=lambda b: setattr(b, "future_handle",
                                                        12345)))
    time.sleep(0.0005 * (n % 5))
    responses.cancel()
    requests.put(None)


def _jax_client(cluster) -> subprocess.CompletedProcess:
  env = dict(os.environ)
  # Under tests/sanitizers/: a client loads none of csrc/, so the
  # sanitizer's runtime would only slow it (jaxlib's every allocation).
  for name in ("JAX_PLATFORMS", "JAX_PATHWAYS_TOKEN", "LD_PRELOAD"):
    env.pop(name, None)
  # Outside the checkout: `python -c` would import its unbuilt sources.
  return subprocess.run([sys.executable, "-c", CLIENT, cluster.address,
                         cluster.token], env=env, capture_output=True,
                        text=True, timeout=120, cwd="/")


def test_controller_survives_sessions_that_end_abruptly(tcp_cluster):
  controller = tcp_cluster.controller
  address = tcp_cluster.address.split("://")[1]
  for n in range(RAW_SESSIONS):
    try:
      _abrupt_session(address, tcp_cluster.token, n)
    except grpc.RpcError:
      # A controller that crashed resets the connection; name the crash.
      time.sleep(1)
      assert controller.poll() is None, (
          f"controller died (rc {controller.returncode}) in session {n + 1}; "
          f"its log is in {tcp_cluster.log_dir}")
      raise
  # Real clients that exit right after one jit; the last must be served.
  for _ in range(JAX_SESSIONS):
    out = _jax_client(tcp_cluster)
    assert controller.poll() is None, (
        f"controller died (rc {controller.returncode}); its log is in "
        f"{tcp_cluster.log_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "45.0"
