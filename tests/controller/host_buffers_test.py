"""The host-buffer side channel (served by the C++ frontend), spoken raw."""
import grpc
import numpy as np
import pytest

pytestmark = pytest.mark.integration


@pytest.fixture
def channel(pathways):
  with grpc.insecure_channel(pathways.address.split("://")[1]) as ch:
    yield ch


@pytest.fixture
def session_id(raw_session):
  """The id of a live session of our own (a session's host buffers are
  reachable only through its id, which only that client learns)."""
  return raw_session().id


def test_store_lookup_delete(channel, session_id, side_channel):
  data = bytes(range(256)) * 9000  # ~2.3 MB: several chunks each way
  side_channel.store(channel, session_id, 10**9,
                     [data[:1 << 20], data[1 << 20:]])
  assert side_channel.lookup(channel, session_id, 10**9) == data
  side_channel.delete(channel, session_id, 10**9)
  with pytest.raises(grpc.RpcError) as e:
    side_channel.lookup(channel, session_id, 10**9)
  assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_uploads_of_odd_chunks_arrive_whole(channel, session_id, side_channel):
  """Chunks are kept as gRPC's slices (controller/server/grpc_server.cc): empty,
  tiny and multi-slice chunks, in any mix, come back whole."""
  data = np.random.default_rng(0).integers(0, 256, 3 << 20, np.uint8).tobytes()
  cuts = [0, 0, 1, 7, 70_000, (1 << 20) + 3, (1 << 20) + 3, 3 << 20]
  chunks = [data[a:b] for a, b in zip(cuts, cuts[1:])]
  side_channel.store(channel, session_id, 10**9 + 4, chunks)
  assert side_channel.lookup(channel, session_id, 10**9 + 4) == data
  side_channel.delete(channel, session_id, 10**9 + 4)


def test_empty_buffer_round_trips(channel, session_id, side_channel):
  side_channel.store(channel, session_id, 10**9 + 1, [])
  assert side_channel.lookup(channel, session_id, 10**9 + 1) == b""
  side_channel.delete(channel, session_id, 10**9 + 1)


def test_bad_uploads_are_refused(channel, session_id, side_channel):
  with pytest.raises(grpc.RpcError) as e:
    side_channel.store(channel, session_id, 10**9 + 2, [b"abc"], size=5)
  assert e.value.code() == grpc.StatusCode.DATA_LOSS
  with pytest.raises(grpc.RpcError) as e:
    side_channel.store(channel, session_id, 10**9 + 2, [b"ab", b"cdef"],
                       size=3)
  assert e.value.code() == grpc.StatusCode.DATA_LOSS
  assert "larger than announced" in e.value.details()
  with pytest.raises(grpc.RpcError) as e:  # no room for what it announces
    side_channel.store(channel, session_id, 10**9 + 2, [b"abc"],
                       size=1 << 62)
  assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
  with pytest.raises(grpc.RpcError) as e:
    side_channel.store(channel, 12345, 1, [b"abc"])
  assert e.value.code() == grpc.StatusCode.NOT_FOUND
  with pytest.raises(grpc.RpcError) as e:  # tiny chunks cost the server
    side_channel.store(channel, session_id, 10**9 + 2, [b"x"] * 200)
  assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
  assert "send chunks of at least 1 KiB" in e.value.details()
  side_channel.store(channel, session_id, 10**9 + 3, [b"x"])
  with pytest.raises(grpc.RpcError) as e:
    side_channel.store(channel, session_id, 10**9 + 3, [b"y"])
  assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
  side_channel.delete(channel, session_id, 10**9 + 3)
  call = channel.unary_unary(
      "/xla.ifrt.proxy.GrpcIfrtService/HostBufferReadFromDisk")
  with pytest.raises(grpc.RpcError) as e:
    call(b"", timeout=10)
  assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
  with pytest.raises(grpc.RpcError) as e:
    channel.unary_unary("/no.Such/Method")(b"", timeout=10)
  assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
