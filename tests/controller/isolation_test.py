"""One client can never read, delete or run another's arrays and
executables: handles are per session, and a session's id (which names its
host buffers) is never shown to anyone else."""
import json

import grpc
import jax
import numpy as np
import pytest

from jax_pathways import admin
from jax_pathways.wire import protos
from jax_pathways.wire.session_keys import (CALLBACKS_KEY, SESSION_METADATA,
                                            TOKEN_KEY)

pytestmark = pytest.mark.integration

NOT_FOUND = 5
SERVER_HANDLES = 1 << 48
SESSION = "/xla.ifrt.proxy.GrpcIfrtService/IfrtSession"


def _fill(**fields):
  return lambda body: [setattr(body, k, v) for k, v in fields.items()]


def test_guessed_handles_get_errors_never_data(raw_session, proxy_devices,
                                               pathways):
  # The test process's own client holds arrays and a compiled program.
  x = jax.device_put(np.arange(16, dtype=np.float32), proxy_devices[0])
  y = jax.jit(lambda a: a * 3 + 1)(x)
  y.block_until_ready()

  intruder = raw_session()
  guesses = range(1, 129)
  for h in guesses:
    r = intruder.call(copy_to_host_buffer_request=_fill(
        array_handle=h, host_buffer_handle=10**6 + h))
    assert r.response_metadata.status.code == NOT_FOUND
    assert f"unknown array handle: {h}" in r.response_metadata.status.message
    r = intruder.call(loaded_executable_execute_request=_fill(
        loaded_executable_handle=h))
    assert r.response_metadata.status.code == NOT_FOUND
    r = intruder.call(check_future_request=_fill(
        future_handle=SERVER_HANDLES + h))
    assert r.response_metadata.status.code == NOT_FOUND
  r = intruder.call(destruct_array_request=lambda b: b.array_handle.extend(
      guesses))
  assert r.response_metadata.status.code == NOT_FOUND
  r = intruder.call(delete_array_request=lambda b: b.array_handle.extend(
      guesses))
  assert r.response_metadata.status.code == NOT_FOUND

  # Nothing of ours was touched.
  np.testing.assert_array_equal(np.asarray(y), np.arange(16) * 3 + 1)
  np.testing.assert_array_equal(np.asarray(x), np.arange(16))

  # Status names clients by number, never by their secret session id.
  status = admin.status(pathways.address, pathways.token)
  assert len(status["clients"]) >= 2
  assert str(intruder.id) not in json.dumps(status)
  assert all("session" not in c for c in status["clients"])


def test_a_session_may_not_take_another_sessions_callbacks(pathways,
                                                          proxy_devices):
  """A token holder who learnt this process's callbacks id opens a session
  naming it: refused, so its programs' callbacks cannot run this process's
  callables, and this process's callbacks go on (issue 53)."""
  from jax_pathways.client import host_callbacks  # pylint: disable=import-outside-toplevel
  victim = host_callbacks.serving()[2]
  meta = protos.msg("xla.ifrt.proxy.GrpcIfrtSessionMetadata")()
  meta.version.protocol_version = 25
  meta.version.ifrt_serdes_version_number = 3
  attributes = meta.initialization_data.attributes
  attributes[TOKEN_KEY].string_value = pathways.token.encode()
  attributes[CALLBACKS_KEY].string_value = victim.encode()
  channel = grpc.insecure_channel(pathways.address.split("://", 1)[1])
  try:
    call = channel.stream_stream(SESSION)(
        iter([]), metadata=[(SESSION_METADATA, meta.SerializeToString())],
        timeout=60)
    with pytest.raises(grpc.RpcError) as e:
      list(call)
  finally:
    channel.close()
  assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS, e.value
  assert "callbacks id of another live session" in e.value.details()
  seen = []
  jax.jit(lambda v: jax.pure_callback(
      lambda a: seen.append(1) or a, jax.ShapeDtypeStruct(v.shape, v.dtype),
      v))(jax.device_put(np.ones(4, np.float32), proxy_devices[0]))
  assert seen == [1]
