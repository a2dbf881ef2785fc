"""Uploads streamed to a worker while they arrive (csrc/controller/dispatcher/stages.h): the
frontend's gRPC thread forwards each chunk's pieces, and the PUT naming the
stage goes without its bytes. A worker on this host copies the pieces out
of the controller's memory into the stage, and a PUT whose stage is not
whole, or holds other bytes, reads its own tails instead; a worker on
another host (TCP) is sent the bytes, and its PUT comes with them after all
if the stage did not get them all, or got other bytes. The real frontend,
dispatcher and executor in this process, over a socket pair."""
import contextlib
import socket
import threading
import time

import grpc
import jax
import numpy as np
import pytest

from jax_pathways import _core
from jax_pathways import _server
from jax_pathways import admin
import jax_pathways
from jax_pathways.wire import payloads

from socket_pairs import tcp_pair  # tests/ is on sys.path (conftest.py)

SESSION = 5
CHUNK = 1 << 20
MAX_STAGES = 256  # kMaxStages, transport/messages.h


def _wait_for(predicate, timeout=10.0):
  deadline = time.monotonic() + timeout
  while not predicate():
    assert time.monotonic() < deadline, "not within the deadline"
    time.sleep(0.01)


@contextlib.contextmanager
def _rig(kind: str):
  """(frontend, dispatcher, executor, channel to the frontend): island 0's
  worker reading the dispatcher's memory as one on this host does
  ("local"), or connected over TCP as one on another host is ("remote")."""
  server = _server.GrpcServer()
  port = server.start("127.0.0.1:0", 256 << 20, 10.0, python_unary=[],
                      python_streams=[])
  server.host_buffers.open_session(SESSION)
  a, b = socket.socketpair() if kind == "local" else tcp_pair()
  # A window past the worker's stages: PUTs are never held back here.
  dispatcher = _core.Dispatcher(MAX_STAGES + 8)
  dispatcher.add_island(0, a.detach(), "w0", 0)
  executor = _core.Executor(b.detach())
  if kind == "local":
    _wait_for(lambda: dispatcher.stats()[0]["reads_locally"])
  channel = grpc.insecure_channel(f"127.0.0.1:{port}")
  try:
    yield server, dispatcher, executor, channel
  finally:
    channel.close()
    server.shutdown()
    dispatcher.shutdown()
    executor.shutdown()


@pytest.fixture(params=["local", "remote"])
def rig(request):
  with _rig(request.param) as r:
    yield r


@pytest.fixture
def remote_rig():
  with _rig("remote") as r:
    yield r


def _remote(dispatcher) -> bool:
  return not dispatcher.stats()[0]["reads_locally"]


def _stream(dispatcher, total: int, base: int = 0, stage: int = 0):
  """(stage, stream): an upload into a stage of `total` bytes on island 0,
  from `base` on; a new stage unless given."""
  stage = stage or dispatcher.new_stage()
  return stage, dispatcher.stream_upload(stage, [(0, total, base)])


def _upload(n: int, seed: int) -> bytes:
  return np.random.default_rng(seed).integers(0, 256, n, np.uint8).tobytes()


def _put(dispatcher, executor, upload, stage: int, buffer: int,
         *more) -> bytes:
  """Submits the PUT the controller makes of `upload` (and `more` uploads:
  the shards of an array) and returns the bytes the worker's op carries
  (each blob checked 64-byte aligned, as PJRT needs), joined."""
  head = {"dtype": "uint8", "shape": [upload.nbytes]}
  dispatcher.submit([(0, _core.OpKind.PUT, 0, [], [buffer],
                      payloads.parts(head, upload, *more))], buffer,
                    stages=[stage])
  op = executor.next(5.0)
  _, blobs = payloads.decode(op.payload)
  assert len(blobs) == 1 + len(more)
  for blob in blobs:
    assert np.frombuffer(blob, np.uint8).ctypes.data % 64 == 0
  executor.complete(op.seq, 0, "", b"")
  return b"".join(bytes(blob) for blob in blobs)


def test_an_upload_streamed_as_it_arrives_is_put_from_its_stage(
    rig, side_channel):
  server, dispatcher, executor, channel = rig
  data = _upload(3 * CHUNK + 1000, 0)
  stage, stream = _stream(dispatcher, len(data))
  assert server.host_buffers.take(SESSION, 9, stream) is None  # not yet in
  del stream  # the frontend holds its own reference
  side_channel.store(channel, SESSION, 9,
                     [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)])
  upload = payloads.Pieces(*server.host_buffers.take(SESSION, 9))
  assert dispatcher.stats()[0]["staged_bytes"] == len(data)
  assert _put(dispatcher, executor, upload, stage, 1) == data
  assert executor.staged_puts == (1, 0)


def test_shards_streamed_interleaved_are_put_from_one_stage(
    rig, side_channel):
  """An array's shards are uploaded at once, their chunks interleaved:
  each streams into its place in the island's one stage (the PUT's tails,
  back to back), the later shard's first, and the PUT takes the stage."""
  server, dispatcher, executor, channel = rig
  hb = server.host_buffers
  a, b = _upload(2 * CHUNK, 6), _upload(2 * CHUNK, 7)
  stage, stream_a = _stream(dispatcher, 4 * CHUNK, 0)
  _, stream_b = _stream(dispatcher, 4 * CHUNK, 2 * CHUNK, stage)
  assert hb.take(SESSION, 60, stream_a) is None
  assert hb.take(SESSION, 61, stream_b) is None
  del stream_a, stream_b
  b_in = threading.Event()

  def a_chunks():
    yield a[:CHUNK]
    assert b_in.wait(10)  # b whole between a's two chunks
    yield a[CHUNK:]

  a_in = side_channel.store_async(channel, SESSION, 60, a_chunks(),
                                  size=len(a))
  _wait_for(lambda: dispatcher.stats()[0]["staged_bytes"] == CHUNK)
  side_channel.store(channel, SESSION, 61, [b[:CHUNK], b[CHUNK:]])
  b_in.set()
  a_in.result(timeout=10)
  assert dispatcher.stats()[0]["staged_bytes"] == 4 * CHUNK
  shard_a = payloads.Pieces(*hb.take(SESSION, 60))
  shard_b = payloads.Pieces(*hb.take(SESSION, 61))
  assert _put(dispatcher, executor, shard_a, stage, 1, shard_b) == a + b
  assert executor.staged_puts == (1, 0)


def test_a_stage_missing_a_shard_is_not_used(rig, side_channel):
  """A PUT of two shards whose stage got only one of them (the other was
  in before its stream began) gets its own bytes."""
  server, dispatcher, executor, channel = rig
  hb = server.host_buffers
  a, b = _upload(2 * CHUNK, 8), _upload(2 * CHUNK, 9)
  side_channel.store(channel, SESSION, 71, [b[:CHUNK], b[CHUNK:]])
  stage, stream = _stream(dispatcher, 4 * CHUNK, 0)
  assert hb.take(SESSION, 70, stream) is None
  side_channel.store(channel, SESSION, 70, [a[:CHUNK], a[CHUNK:]])
  shard_a = payloads.Pieces(*hb.take(SESSION, 70))
  shard_b = payloads.Pieces(*hb.take(SESSION, 71))
  assert _put(dispatcher, executor, shard_a, stage, 1, shard_b) == a + b
  assert executor.staged_puts == ((0, 0) if _remote(dispatcher) else (0, 1))


def test_a_stage_of_other_bytes_or_dropped_is_not_used(rig, side_channel):
  """A PUT naming a stage that holds another upload's pieces gets its own
  bytes (the worker reads them, or they are sent); so does one whose stage
  was dropped (unstage) before it came."""
  server, dispatcher, executor, channel = rig
  hb = server.host_buffers
  # A worker elsewhere is sent the right bytes; one here reads them.
  not_taken = (0, 0) if _remote(dispatcher) else (0, 1)
  first, second = _upload(2 * CHUNK, 1), _upload(2 * CHUNK, 2)
  stage, stream = _stream(dispatcher, len(first))
  assert hb.take(SESSION, 20, stream) is None
  side_channel.store(channel, SESSION, 20, [first[:CHUNK], first[CHUNK:]])
  side_channel.store(channel, SESSION, 21, [second[:CHUNK], second[CHUNK:]])
  kept = payloads.Pieces(*hb.take(SESSION, 20))  # the stage's, kept alive
  other = payloads.Pieces(*hb.take(SESSION, 21))
  assert _put(dispatcher, executor, other, stage, 1) == second
  assert executor.staged_puts == not_taken

  stage, stream = _stream(dispatcher, len(first))
  assert hb.take(SESSION, 22, stream) is None
  side_channel.store(channel, SESSION, 22, [first[:CHUNK], first[CHUNK:]])
  dispatcher.unstage([0], stage)
  upload = payloads.Pieces(*hb.take(SESSION, 22))
  assert _put(dispatcher, executor, upload, stage, 2) == first
  assert executor.staged_puts == (0, 2 * not_taken[1])
  # Both stages ended on the worker: a stream as many as it holds works.
  assert _put(dispatcher, executor, kept, 0, 3) == first
  del kept


def test_an_upload_larger_than_its_stream_said_is_not_staged(
    rig, side_channel):
  """The stage holds what the stream announced; more is a different upload
  (the request's own check refuses it): the PUT gets its own bytes."""
  server, dispatcher, executor, channel = rig
  data = _upload(3 * CHUNK, 3)
  stage, stream = _stream(dispatcher, 2 * CHUNK)
  assert server.host_buffers.take(SESSION, 30, stream) is None
  side_channel.store(channel, SESSION, 30,
                     [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)])
  upload = payloads.Pieces(*server.host_buffers.take(SESSION, 30))
  assert _put(dispatcher, executor, upload, stage, 1) == data
  assert executor.staged_puts == ((0, 0) if _remote(dispatcher) else (0, 1))


def test_a_worker_elsewhere_is_sent_no_more_stages_than_it_holds(
    remote_rig, side_channel):
  """Stages sent to a worker on another host are held whole until their
  PUT (which has no bytes of its own): the dispatcher sends it at most
  kMaxStages at once; the uploads beyond them go with their PUTs."""
  server, dispatcher, executor, channel = remote_rig
  hb = server.host_buffers
  data = [_upload(1000, seed) for seed in range(MAX_STAGES + 2)]
  stages = []
  for handle, upload in enumerate(data, 100):
    stage, stream = _stream(dispatcher, len(upload))
    assert hb.take(SESSION, handle, stream) is None
    side_channel.store(channel, SESSION, handle, [upload])
    stages.append(stage)
  assert dispatcher.stats()[0]["staged_bytes"] == 1000 * MAX_STAGES
  for buffer, (handle, upload) in enumerate(enumerate(data, 100), 1):
    taken = payloads.Pieces(*hb.take(SESSION, handle))
    assert _put(dispatcher, executor, taken, stages[buffer - 1],
                buffer) == upload
  assert executor.staged_puts == (MAX_STAGES, 0)


def test_a_worker_elsewhere_is_sent_no_more_staged_bytes_than_it_holds(
    remote_rig, side_channel):
  """A worker on another host makes room for a stage's whole declared
  size at its first part, however little the client then sends: the
  dispatcher sends it stages of at most 1 GiB in all (kMaxSentStageBytes);
  an upload beyond that goes with its PUT."""
  server, dispatcher, executor, channel = remote_rig
  hb = server.host_buffers
  data = _upload(1000, 5)
  declared = [(1 << 30) + 1, 700 << 20, 700 << 20]  # sent: the second only
  stages = []
  for handle, size in enumerate(declared, 50):
    stage, stream = _stream(dispatcher, size)
    assert hb.take(SESSION, handle, stream) is None
    side_channel.store(channel, SESSION, handle, [data])
    stages.append(stage)
  assert dispatcher.stats()[0]["staged_bytes"] == len(data)
  for buffer, handle in enumerate(range(50, 53), 1):
    upload = payloads.Pieces(*hb.take(SESSION, handle))
    assert _put(dispatcher, executor, upload, stages[buffer - 1],
                buffer) == data
  assert executor.staged_puts == (0, 0)  # none whole: each sent with its PUT


def test_a_closed_session_stops_its_streams(rig, side_channel):
  """A session's streams end with it: its uploads are refused and nothing
  more is staged."""
  server, dispatcher, _, channel = rig
  _, stream = _stream(dispatcher, 2 * CHUNK)
  assert server.host_buffers.take(SESSION, 40, stream) is None
  server.host_buffers.close_session(SESSION)
  with pytest.raises(grpc.RpcError) as e:
    side_channel.store(channel, SESSION, 40, [b"x" * CHUNK] * 2)
  assert e.value.code() == grpc.StatusCode.NOT_FOUND
  assert dispatcher.stats()[0]["staged_bytes"] == 0


@pytest.mark.integration
def test_large_device_puts_stream_to_their_worker(pathways):
  """Through the embedded cluster, as a user uploads: each array arrives
  whole, and its bytes were staged on the worker while they arrived (an
  upload that is all in before the controller handles its request, which
  a loaded machine may make of one, has nothing to stream)."""
  address, token = jax_pathways.connection()

  def staged() -> int:
    return sum(i["staged_bytes"]
               for i in admin.status(address, token)["islands"])

  streamed = []
  for seed in range(3):
    x = np.random.default_rng(seed).standard_normal(4 << 20).astype(
        np.float32)
    before = staged()
    y = jax.device_put(x, jax.devices()[0])
    np.testing.assert_array_equal(np.asarray(y), x)
    streamed.append(staged() - before)
  assert set(streamed) <= {0, x.nbytes} and x.nbytes in streamed, streamed


@pytest.mark.integration
@pytest.mark.parametrize("devices", [4, 8], ids=["one-island", "two-islands"])
def test_large_sharded_device_puts_stream_to_their_workers(pathways, devices):
  """A sharded `jax.device_put` uploads its shards at once: they stream
  into one stage on each island's worker, each at its place, and the array
  arrives whole (a shard in before its request is handled, which a loaded
  machine may make of one, has its PUT send the bytes instead)."""
  address, token = jax_pathways.connection()

  def staged() -> int:
    return sum(i["staged_bytes"]
               for i in admin.status(address, token)["islands"])

  mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("x",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
  streamed = []
  for seed in range(3):
    x = np.random.default_rng(seed).standard_normal(
        (devices, 1 << 20)).astype(np.float32)
    before = staged()
    y = jax.device_put(x, sharding)
    np.testing.assert_array_equal(np.asarray(y), x)
    for shard in y.addressable_shards:
      np.testing.assert_array_equal(np.asarray(shard.data), x[shard.index])
    streamed.append(staged() - before)
  assert x.nbytes in streamed, streamed
