"""The steady state in C++ (csrc/controller/fast_path/fast_path.h): Execute,
CheckValueReady, DestructArray and the reads of a training loop are
answered without Python, with the same results and errors as Python's
handlers, and leave nothing behind."""
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jax_pathways import admin, dtypes
from jax_pathways.wire import protos
import bits  # tests/conftest.py puts tests/ on sys.path
import processes
from jax_pathways.programs import sharding as sharding_lib
from jax_pathways.programs.sharding import Sharding

pytestmark = pytest.mark.integration


def _stats(cluster) -> dict[str, int]:
  return admin.status(cluster.address, cluster.token)["fast_path"]


def _taken(cluster, run, device, reference):
  """Runs `run(device)` once to warm up, then again counting what the fast
  path took; checks the second run's bits against `run(reference)`."""
  run(device)
  before = _stats(cluster)
  got = run(device)
  after = _stats(cluster)
  bits.assert_same(run(reference), got)
  return {k: after[k] - before[k] for k in after}


def _logged(step, x, steps: int, every: int) -> list[np.ndarray]:
  """`steps` calls of `step` on its own result, read every `every` calls."""
  seen = []
  for i in range(steps):
    x = step(x)
    if i % every == 0:
      seen.append(np.asarray(x))
  return seen + [np.asarray(x)]


def _chain(devices, n: int, wait_each: bool):
  mesh = Mesh(np.array(devices[:4]), ("i",))
  step = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "i") * 0.25 + a,
                               mesh=mesh, in_specs=P("i"), out_specs=P("i")))
  y = jax.device_put(jnp.arange(4.0, dtype=jnp.float32),
                     NamedSharding(mesh, P("i")))
  for _ in range(n):
    y = step(y)
    if wait_each:
      y.block_until_ready()
  return np.asarray(y)


@pytest.mark.parametrize("wait_each", [False, True])
def test_a_loop_runs_in_cpp_with_plain_jax_bits(pathways, proxy_devices,
                                                cpu_devices, wait_each):
  used = _taken(pathways, lambda devices: _chain(devices, 40, wait_each),
                proxy_devices, cpu_devices)
  # Every call after the upload's first, and the arrays it replaced.
  assert used["executes"] >= 39, used
  assert used["destructs"] >= 38, used
  if wait_each:
    assert used["ready_checks"] >= 39, used


def test_donated_arguments_keep_plain_jax_bits(pathways, proxy_devices, cpu_devices):
  def run(device):
    double = jax.jit(lambda x: x * 2.0 + 1.0, donate_argnums=0)
    x = jax.device_put(jnp.ones((256,), jnp.float32), device)
    for _ in range(30):
      x = double(x)
    return np.asarray(x)

  used = _taken(pathways, run, proxy_devices[0], cpu_devices[0])
  # The first call's argument is an upload Python holds; the calls queued
  # behind it wait in C++ until Python has handled it, then are C++'s. What
  # is taken marks its argument donated, and its destruct is taken too.
  assert used["executes"] >= 28, used
  assert used["destructs"] >= 27, used


def test_logged_reads_run_in_cpp_with_plain_jax_bits(pathways, proxy_devices,
                                                    cpu_devices):
  """A loop that reads its value every few steps (np.asarray: JAX's client
  asks for the one-device array's only shard, then copies that to a host
  buffer): both requests are C++'s, and so is every call around them."""
  def run(device):
    inc = jax.jit(lambda x: x + 1.5)
    x = jax.device_put(jnp.zeros((8,), jnp.float32), device)
    seen = []
    for i in range(20):
      x = inc(x)
      x.block_until_ready()  # each call decided before the next comes
      if i % 5 == 0:
        seen.append(np.asarray(x))
    return seen + [np.asarray(x)]

  used = _taken(pathways, run, proxy_devices[1], cpu_devices[1])
  assert used["executes"] >= 19, used
  assert used["shards"] >= 5 and used["reads"] >= 5, used


def test_a_read_array_donated_next_keeps_plain_jax_bits(
    pathways, proxy_devices, cpu_devices):
  """The shard a read made names the array's buffer: the next call donating
  the array is Python's (it takes both handles over), and the loop goes on
  with the same bits."""
  def run(device):
    step = jax.jit(lambda x: x * 0.5 + 1.0, donate_argnums=0)
    return _logged(step, jax.device_put(jnp.arange(8.0, dtype=jnp.float32),
                                        device), 24, 4)

  used = _taken(pathways, run, proxy_devices[2], cpu_devices[2])
  assert used["reads"] >= 6, used


def _data_parallel(devices, donate: bool):
  """A data-parallel loop over 4 devices logging its replicated loss every
  few steps (np.asarray: its first device's shard, then that shard's
  bytes)."""
  mesh = Mesh(np.array(devices[:4]), ("i",))

  def step(w, x):
    loss = jnp.mean((x @ w) ** 2)
    return w - 0.01 * jax.grad(lambda w: jnp.mean((x @ w) ** 2))(w), loss

  step = jax.jit(step, donate_argnums=(0,) if donate else ())
  w = jax.device_put(jnp.ones((8, 2), jnp.float32) * 0.5,
                     NamedSharding(mesh, P()))
  x = jax.device_put(jnp.arange(64.0, dtype=jnp.float32).reshape(8, 8) / 64,
                     NamedSharding(mesh, P("i")))
  losses = []
  for i in range(24):
    w, loss = step(w, x)
    if i % 4 == 0:
      losses.append(np.asarray(loss))
      if donate:  # the next step donates w with a shard of it alive
        losses.append(np.asarray(w))
  return losses + [np.asarray(w)]


@pytest.mark.parametrize("donate", [False, True])
def test_a_replicated_loss_is_read_in_cpp_with_plain_jax_bits(
    pathways, proxy_devices, cpu_devices, donate):
  """The shard of a replicated array is a COPY op's new buffer holding
  part of the array's memory: made, read and deleted in C++; a launch
  donating the array while the shard lives is Python's, which takes both
  over as sharing memory."""
  _data_parallel(proxy_devices, donate)
  before = _stats(pathways)
  got = _data_parallel(proxy_devices, donate)
  after = _stats(pathways)
  expected = _data_parallel(cpu_devices, donate)
  assert len(expected) == len(got)
  for e, a in zip(expected, got):
    bits.assert_same(e, a)
  used = {k: after[k] - before[k] for k in after}
  reads = 12 if donate else 6
  assert used["shards"] >= reads and used["reads"] >= reads, used
  assert used["executes"] >= (18 if donate else 23), used


def test_reads_of_a_sharded_array_run_in_cpp_with_plain_jax_bits(
    pathways, proxy_devices, cpu_devices):
  """np.asarray of an array sharded over 4 devices: its shards
  (DisassembleIntoSingleDeviceArrays, a COPY op of new buffers sharing its
  memory), each shard's own shard (another handle of its buffer) and the
  four reads are all C++'s, and so is every call around them."""
  def run(devices):
    mesh = Mesh(np.array(devices[:4]), ("i",))
    x = jax.device_put(jnp.arange(8.0, dtype=jnp.float32),
                       NamedSharding(mesh, P("i")))
    return _logged(jax.jit(lambda x: x * 0.5 + 1.5), x, 20, 5)

  used = _taken(pathways, run, proxy_devices, cpu_devices)
  assert used["executes"] >= 19, used
  assert used["reads"] >= 20 and used["shards"] >= 25, used


def test_arrays_python_needs_move_to_it_and_back(pathways, proxy_devices,
                                                 cpu_devices):
  """A copy of the loop's array to another device (CopyArrays, Python's)
  takes it over; the loop's calls after it go to C++ again once Python has
  handed it back."""
  def run(devices):
    inc = jax.jit(lambda x: x + 1.5)
    x = jax.device_put(jnp.zeros((8,), jnp.float32), devices[1])
    seen = []
    for i in range(20):
      x = inc(x)
      x.block_until_ready()  # each call decided before the next comes
      if i % 5 == 0:
        seen.append(np.asarray(jax.device_put(x, devices[2])))
    return seen + [np.asarray(x)]

  used = _taken(pathways, run, proxy_devices, cpu_devices)
  assert used["executes"] >= 12, used


def _fill(**fields):
  return lambda body: [setattr(body, k, v) for k, v in fields.items()]


def test_a_read_and_its_shard_in_cpp_over_the_wire(pathways, raw_session):
  """FullyReplicatedShard and CopyToHostBuffer as the fast path answers
  them: the shard's handle in the reply, the bytes stored before it, a
  taken host buffer handle refused as Python refuses it, and the buffer
  deleted only with the last of its handles."""
  def live():
    return admin.status(pathways.address, pathways.token)["live_buffers"]

  session = raw_session()
  data = np.arange(16, dtype=np.float32)
  session.store(1, data.tobytes())
  r = session.wait(session.send_make_array(1, 2, 16))
  assert r.response_metadata.status.code == 0, r
  start, before = live(), _stats(pathways)
  r = session.call(fully_replicated_shard_request=_fill(
      array_handle=2, copy_semantics=2, result_handle=3))
  assert r.response_metadata.status.code == 0, r
  assert r.fully_replicated_shard_response.array_handle == 3
  assert session.fetch(3, 10) == data.tobytes()
  assert session.fetch(2, 11) == data.tobytes()
  # The same host buffer handle again: refused by C++, then (with strides,
  # which only Python takes) by Python, in the same words.
  errors = []
  for strides in (None, [4]):
    def fill(body, strides=strides):
      body.array_handle, body.host_buffer_handle = 3, 10
      if strides is not None:
        body.byte_strides.strides.extend(strides)
    status = session.call(copy_to_host_buffer_request=fill).response_metadata.status
    errors.append((status.code, status.message))
  assert errors[0] == errors[1], errors
  assert errors[0][0] == 6 and "host buffer 10 already exists" in errors[0][1]
  after = _stats(pathways)
  assert after["shards"] - before["shards"] == 1
  assert after["reads"] - before["reads"] == 3
  # One handle gone: the other still reads; both gone: the buffer too.
  r = session.call(destruct_array_request=lambda b: b.array_handle.append(2))
  assert r.response_metadata.status.code == 0, r
  assert session.fetch(3, 12) == data.tobytes()
  assert live() == start
  r = session.call(destruct_array_request=lambda b: b.array_handle.append(3))
  assert r.response_metadata.status.code == 0, r
  deadline = time.monotonic() + 10
  while live() >= start and time.monotonic() < deadline:
    time.sleep(0.05)
  assert live() == start - 1
  r = session.call(copy_to_host_buffer_request=_fill(
      array_handle=3, host_buffer_handle=13))
  assert r.response_metadata.status.code == 5, r  # NOT_FOUND, from Python


def test_a_deleted_argument_fails_as_python_words_it(pathways,
                                                     proxy_devices):
  inc = jax.jit(lambda x: x + 1.0)
  x = inc(jax.device_put(jnp.zeros((4,), jnp.float32), proxy_devices[0]))
  y = inc(x)
  y.block_until_ready()
  x.delete()
  with pytest.raises(Exception, match="Array has been deleted"):
    inc(x).block_until_ready()
  assert np.asarray(inc(y)).tolist() == [3.0] * 4


# A client that leaves arrays in the fast path's table when it exits: a
# chained loop's last output, never freed before the session ends.
_LEAVING_CLIENT = textwrap.dedent("""
    import sys
    import jax_pathways
    jax_pathways.initialize(sys.argv[1], token=sys.argv[2])
    import jax, jax.numpy as jnp
    step = jax.jit(lambda a: a * 0.5 + 1.0)
    y = jax.device_put(jnp.zeros((16,), jnp.float32), jax.devices()[2])
    kept = []
    for i in range(40):
      y = step(y)
      if i % 8 == 0:
        kept.append(y)
    y.block_until_ready()
    print("ok")
    sys.stdout.flush()
    import os
    os._exit(0)  # no clean-up: the controller must free what it held
""")


def test_a_closed_session_leaves_no_buffer(pathways):
  def live():
    return admin.status(pathways.address, pathways.token)["live_buffers"]

  start = live()
  out = subprocess.run(
      [sys.executable, "-c", _LEAVING_CLIENT, pathways.address,
       pathways.token], capture_output=True, text=True, timeout=120,
      cwd=tempfile.gettempdir())
  assert out.stdout.strip() == "ok", out.stderr[-3000:]
  # The session's close is asynchronous; this process's own frees since
  # `start` can only lower the count.
  deadline = time.monotonic() + 30
  while live() > start and time.monotonic() < deadline:
    time.sleep(0.2)
  assert live() <= start


def test_a_replicated_array_s_shard_in_cpp_over_the_wire(pathways,
                                                         raw_session):
  """FullyReplicatedShard of an array replicated over 4 devices makes a new
  buffer of part of its memory (a COPY op): it outlives the array's
  destruct, and goes with its own; a request Python answers takes the
  array and its shard over together, still sharing memory."""
  def live():
    return admin.status(pathways.address, pathways.token)["live_buffers"]

  def shard(array, result):
    r = session.call(fully_replicated_shard_request=_fill(
        array_handle=array, copy_semantics=2, result_handle=result))
    assert r.response_metadata.status.code == 0, r
    assert r.fully_replicated_shard_response.array_handle == result

  def destruct(handle):
    r = session.call(destruct_array_request=lambda b: b.array_handle.append(
        handle))
    assert r.response_metadata.status.code == 0, r

  def settled(count):
    deadline = time.monotonic() + 10
    while live() != count and time.monotonic() < deadline:
      time.sleep(0.05)
    return live()

  session = raw_session()
  data = np.arange(8, dtype=np.float32)
  session.store(1, data.tobytes())
  r = session.wait(session.send_make_array(1, 2, 8, devices=(0, 1, 2, 3)))
  assert r.response_metadata.status.code == 0, r
  start, before = live(), _stats(pathways)
  shard(2, 3)
  assert session.fetch(3, 10) == data.tobytes()
  destruct(2)  # the shard keeps its part of the memory
  assert session.fetch(3, 11) == data.tobytes()
  destruct(3)
  assert settled(start - 1) == start - 1
  after = _stats(pathways)
  assert after["shards"] - before["shards"] == 1
  assert after["reads"] - before["reads"] == 2

  # Again; then Python answers a read of the array (with strides, which
  # only Python takes): it takes the array and its shard over.
  session.store(4, data.tobytes())
  r = session.wait(session.send_make_array(4, 5, 8, devices=(0, 1, 2, 3)))
  assert r.response_metadata.status.code == 0, r
  shard(5, 6)

  def strided(body):
    body.array_handle, body.host_buffer_handle = 5, 12
    body.byte_strides.strides.append(4)

  r = session.call(copy_to_host_buffer_request=strided)
  assert r.response_metadata.status.code == 0, r
  assert session.lookup(12) == data.tobytes()
  assert session.fetch(6, 13) == data.tobytes()
  destruct(5)
  assert session.fetch(6, 14) == data.tobytes()
  destruct(6)
  assert settled(start - 1) == start - 1


def test_uploads_alike_run_in_cpp_with_plain_jax_bits(pathways, proxy_devices,
                                                      cpu_devices):
  """A loop putting a new batch every step: after Python has made the first
  array of a kind (dtype, shape, sharding: the request but for its
  handles), the uploads alike are C++'s (a PUT of the upload's pieces as
  they arrived); one that has not arrived yet is Python's, which waits."""
  def run(device):
    step = jax.jit(lambda w, b: w * 0.5 + b)
    w = jax.device_put(jnp.zeros((64,), jnp.float32), device)
    rng = np.random.default_rng(0)
    for _ in range(30):
      w = step(w, jax.device_put(rng.random(64, dtype=np.float32), device))
    return np.asarray(w)

  used = _taken(pathways, run, proxy_devices[3], cpu_devices[3])
  assert used["uploads"] >= 10, used
  assert used["executes"] >= 29, used


def test_uploads_python_answers_over_the_wire(pathways, raw_session):
  """Only an upload alike to one Python made, of the size planned and with
  a new handle is C++'s (one whose bytes come after its request waits for
  them in C++, the stream's later requests behind it); the rest go to
  Python, which words every error."""
  session = raw_session()
  data = np.arange(16, dtype=np.float32)

  def make(host_buffer, array, upload=None):
    if upload is not None:
      session.store(host_buffer, upload)
    return session.wait(session.send_make_array(host_buffer, array, 16))

  def uploads():
    return _stats(pathways)["uploads"]

  assert make(1, 2, data.tobytes()).response_metadata.status.code == 0
  before = uploads()
  r = make(3, 4, (data + 1).tobytes())  # alike: C++'s
  assert r.response_metadata.status.code == 0, r
  assert r.make_array_from_host_buffer_response.array_handle == 4
  assert uploads() == before + 1
  assert session.fetch(4, 100) == (data + 1).tobytes()
  # Another size: Python's words.
  r = make(5, 6, data.tobytes()[:60])
  assert r.response_metadata.status.code == 3, r  # INVALID_ARGUMENT
  assert "64" in r.response_metadata.status.message, r
  # A handle in use: Python's words.
  r = make(7, 4, data.tobytes())
  assert r.response_metadata.status.code == 3, r
  assert "already names an array" in r.response_metadata.status.message, r
  # Not arrived yet: offered to C++ again once it has; the request behind
  # it (here Python's) waits its turn.
  waits = _stats(pathways)["upload_waits"]
  op = session.send_make_array(9, 10, 16)
  behind = session.send_make_array(11, 4, 16)  # a handle in use
  time.sleep(0.2)
  assert _stats(pathways)["upload_waits"] == waits + 1
  session.store(11, data.tobytes())
  time.sleep(0.2)
  assert behind not in session.answered()
  session.store(9, (data * 2).tobytes())
  assert session.wait(op).response_metadata.status.code == 0
  assert session.wait(behind).response_metadata.status.code == 3
  assert session.fetch(10, 101) == (data * 2).tobytes()
  assert uploads() == before + 2
  # Arrived late and of another size: Python's words.
  op = session.send_make_array(13, 14, 16)
  time.sleep(0.2)
  session.store(13, data.tobytes()[:60])
  r = session.wait(op)
  assert r.response_metadata.status.code == 3, r
  assert "64" in r.response_metadata.status.message, r
  assert uploads() == before + 2
  assert _stats(pathways)["upload_waits"] == waits + 2
  # Not there within the frontend's wait (1 s): Python's, which waits on.
  op = session.send_make_array(15, 16, 16)
  time.sleep(1.5)
  session.store(15, (data * 3).tobytes())
  assert session.wait(op).response_metadata.status.code == 0
  assert session.fetch(16, 102) == (data * 3).tobytes()
  assert uploads() == before + 2
  assert _stats(pathways)["upload_waits"] == waits + 3


def _varint(v: int) -> bytes:
  out = bytearray()
  while True:
    out.append((v & 0x7F) | (0x80 if v > 0x7F else 0))
    v >>= 7
    if not v:
      return bytes(out)


def test_a_padded_upload_kind_is_never_remembered(pathways, raw_session):
  """A MakeArrayFromHostBuffer padded with 8 KiB of an unknown field (which
  Python's parser skips): its kind is never planned, so C++ keeps nothing
  of that size, and every such upload stays Python's."""
  session = raw_session()
  data = np.arange(16, dtype=np.float32).tobytes()
  request = protos.msg("xla.ifrt.proxy.IfrtRequest")
  before = _stats(pathways)["uploads"]
  for host_buffer, array in ((1, 2), (3, 4), (5, 6)):
    session.store(host_buffer, data)
    req = request()
    req.request_metadata.op_id = session.next_op_id
    body = req.make_array_from_host_buffer_request
    body.host_buffer_handle, body.array_handle = host_buffer, array
    dtypes.to_proto("float32", body.dtype)
    body.shape.dims.append(16)
    sharding_lib.to_proto(Sharding((0,), None, None), body.sharding)
    padding = b"\x00" * 8192
    padded = (body.SerializeToString() + _varint(99 << 3 | 2) +
              _varint(len(padding)) + padding)
    req.ClearField("make_array_from_host_buffer_request")
    wire = (req.SerializeToString() + _varint(4 << 3 | 2) +
            _varint(len(padded)) + padded)
    r = session.wait(session.send_raw(wire))
    assert r.response_metadata.status.code == 0, r
    assert session.fetch(array, 100 + array) == data
  assert _stats(pathways)["uploads"] == before


def test_two_bodies_mean_the_last_one_as_protobuf_reads_them(pathways,
                                                             raw_session):
  """One IfrtRequest carrying two request kinds (a oneof seen twice): the
  last one is the request, in C++ as in Python, whichever reads it. A
  DestructArray before an IsArrayDeleted is only a question; the other
  order destroys the array."""
  session = raw_session()
  data = np.arange(4, dtype=np.float32).tobytes()
  request = protos.msg("xla.ifrt.proxy.IfrtRequest")

  def two(first: str, second: str, array: int) -> bytes:
    wire = b""
    for kind in (first, second):
      req = request()
      req.request_metadata.op_id = session.next_op_id
      if kind == "destruct":
        req.destruct_array_request.array_handle.append(array)
      else:
        req.is_array_deleted_request.array_handle = array
      wire += req.SerializeToString()
    return wire

  session.store(1, data)
  assert session.wait(session.send_make_array(1, 2, 4)).response_metadata.status.code == 0
  before = _stats(pathways)["destructs"]
  r = session.wait(session.send_raw(two("destruct", "deleted", 2)))
  assert r.WhichOneof("response") == "is_array_deleted_response", r
  assert session.fetch(2, 10) == data  # still there
  r = session.wait(session.send_raw(two("deleted", "destruct", 2)))
  assert r.WhichOneof("response") == "destruct_array_response", r
  r = session.call(copy_to_host_buffer_request=_fill(
      array_handle=2, host_buffer_handle=11))
  assert r.response_metadata.status.code == 5, r  # NOT_FOUND: destroyed
  # Neither was read by C++: each carries a kind it does not know.
  assert _stats(pathways)["destructs"] == before


@pytest.mark.parametrize("n", [4, 8])
def test_sharded_uploads_alike_run_in_cpp_with_plain_jax_bits(
    pathways, proxy_devices, cpu_devices, n):
  """A loop putting a new batch sharded over 4 devices (one island) or 8
  (two islands) every step, one upload per shard: after Python has made the
  first, the MakeArraysFromHostBufferShards alike are C++'s (each island's
  PUT of its shards' pieces, the padding between them as Python put it)."""
  def run(devices):
    mesh = Mesh(np.array(devices[:n]), ("i",))
    step = jax.jit(lambda w, b: w * 0.5 + b.sum(0))
    w = jax.device_put(jnp.zeros((6,), jnp.float32), NamedSharding(mesh, P()))
    rng = np.random.default_rng(0)
    for _ in range(20):  # shards of 2x6 float32: 48 bytes, padded to 64
      batch = rng.random((2 * n, 6), dtype=np.float32)
      w = step(w, jax.device_put(batch, NamedSharding(mesh, P("i"))))
    return np.asarray(w)

  used = _taken(pathways, run, proxy_devices, cpu_devices)
  assert used["uploads"] >= 15, used
  assert used["executes"] >= 19, used


def _tiled(n: int) -> Sharding:
  """Virtual devices 0..n-1, a 1-D array tiled over them in order."""
  return Sharding(tuple(range(n)), protos.msg("xla.OpSharding")(
      type=3, tile_assignment_dimensions=[n],
      tile_assignment_devices=list(range(n))).SerializeToString())


# The arrays of test_sharded_uploads_python_answers_over_the_wire's
# requests: 8 float32 over island 0's 4 devices, 16 over both islands' 8,
# two per shard (8 bytes each: padding between them).
_SHARDED = (4, 8)


def _send_shards(session, uploads, arrays) -> int:
  """MakeArraysFromHostBufferShards of _SHARDED's arrays from `uploads`
  (one per shard, in order) as `arrays`; returns its op_id."""
  def fill(body):
    body.array_handles.extend(arrays)
    it = iter(uploads)
    for n in _SHARDED:
      spec = body.specs.add()
      dtypes.to_proto("float32", spec.array_spec.dtype)
      spec.array_spec.shape.dims.append(2 * n)
      sharding_lib.to_proto(_tiled(n), spec.array_spec.sharding)
      for device in range(n):
        spec.addressable_shard_indices.add().indices.append(device)
        hb = spec.host_buffers.add()
        hb.host_buffer_handle = next(it)
        dtypes.to_proto("float32", hb.dtype)
        hb.shape.dims.append(2)

  return session.send(make_arrays_from_host_buffer_shards_request=fill)


def _read_shards(session, array: int, n: int, handles) -> bytes:
  """An array's bytes as JAX reads them: its n shards, each shard's read."""
  shards = [next(handles) for _ in range(n)]
  r = session.call(disassemble_into_single_device_arrays_request=lambda b: (
      _fill(array_handle=array, copy_semantics=2)(b),
      b.result_handles.extend(shards)))
  assert r.response_metadata.status.code == 0, r
  return b"".join(session.fetch(s, next(handles)) for s in shards)


def test_sharded_uploads_python_answers_over_the_wire(pathways, raw_session):
  """Only a sharded upload alike to one Python made (every array's dtype,
  shape, sharding and shards), each upload of the size planned, and with
  new handles, is C++'s (taken all at once; one whose last upload comes
  after the request waits for it); a host buffer named twice, another
  size or a count that does not match goes to Python, which words every
  error."""
  session = raw_session()
  handles = iter(range(1, 10_000))
  data = np.arange(24, dtype=np.float32)

  def shards(values):
    return [values[k:k + 2].tobytes() for k in range(0, 24, 2)]

  def make(values, *, store=True, named=None):
    uploads = [next(handles) for _ in range(12)] if named is None else named
    if store:
      for h, b in zip(uploads, shards(values)):
        session.store(h, b)
    arrays = [next(handles), next(handles)]
    return arrays, uploads, _send_shards(session, uploads, arrays)

  def check(arrays, values):
    assert _read_shards(session, arrays[0], 4, handles) == values[:8].tobytes()
    assert _read_shards(session, arrays[1], 8, handles) == values[8:].tobytes()

  def uploads():
    return _stats(pathways)["uploads"]

  arrays, _, op = make(data)  # Python's, which plans it
  assert session.wait(op).response_metadata.status.code == 0
  check(arrays, data)
  before = uploads()
  arrays, _, op = make(data + 1)  # alike: C++'s
  r = session.wait(op)
  assert r.response_metadata.status.code == 0, r
  assert list(r.make_arrays_from_host_buffer_shards_response.array_handles) \
      == arrays
  assert uploads() == before + 1
  check(arrays, data + 1)
  # A host buffer named twice: Python's, which takes it for both shards.
  named = [next(handles) for _ in range(12)]
  named[5] = named[4]
  for k, (h, b) in enumerate(zip(named, shards(data + 2))):
    if k != 5:
      session.store(h, b)
  arrays, _, op = make(None, store=False, named=named)
  assert session.wait(op).response_metadata.status.code == 0
  twice = (data + 2).copy()
  twice[10:12] = twice[8:10]
  check(arrays, twice)
  assert uploads() == before + 1
  # One shard of another size: Python's words.
  named = [next(handles) for _ in range(12)]
  for h, b in zip(named, shards(data)):
    session.store(h, b[:4] if h == named[7] else b)
  _, _, op = make(None, store=False, named=named)
  r = session.wait(op)
  assert r.response_metadata.status.code == 3, r  # INVALID_ARGUMENT
  assert "shard 3" in r.response_metadata.status.message, r
  assert "needs 8 bytes but the host buffer has 4" in \
      r.response_metadata.status.message, r
  assert uploads() == before + 1
  # The last two uploads after the request: C++ waits for the last, then
  # for the one before it, then takes all.
  waits = _stats(pathways)["upload_waits"]
  named = [next(handles) for _ in range(12)]
  for h, b in zip(named[:-2], shards(data * 3)):
    session.store(h, b)
  arrays, _, op = make(None, store=False, named=named)
  time.sleep(0.2)
  assert _stats(pathways)["upload_waits"] == waits + 1
  session.store(named[-1], shards(data * 3)[-1])
  time.sleep(0.2)
  assert _stats(pathways)["upload_waits"] == waits + 2
  assert op not in session.answered()
  session.store(named[-2], shards(data * 3)[-2])
  assert session.wait(op).response_metadata.status.code == 0
  check(arrays, data * 3)
  assert uploads() == before + 2
  # A request of no arrays: answered, with none.
  r = session.call(make_arrays_from_host_buffer_shards_request=lambda b: None)
  assert r.response_metadata.status.code == 0, r
  assert not r.make_arrays_from_host_buffer_shards_response.array_handles
  # Fewer array handles than specs: Python's words.
  r = session.call(make_arrays_from_host_buffer_shards_request=lambda b: (
      b.specs.add(), b.specs.add(), b.array_handles.append(next(handles))))
  assert r.response_metadata.status.code == 3, r
  assert "2 specs for 1 array handles" in r.response_metadata.status.message
  assert uploads() == before + 2


def test_a_closed_stream_ends_after_the_replies_it_is_owed(pathways,
                                                          raw_session):
  """CheckValueReady of an array still being made is answered by the fast
  path once the array is ready; a client that half-closes right after
  asking still gets that reply before its stream ends (the stream used to
  end first, and the reply was lost)."""
  session = raw_session()
  session.store(1, np.arange(4, dtype=np.float32).tobytes())
  session.wait(session.send_make_array(1, 1, 4))
  session.store(3, np.arange(4, dtype=np.float32).tobytes())
  ready_checks = _stats(pathways)["ready_checks"]
  worker = pathways.workers[0].pid  # island 0: the arrays' (device 0)
  processes.freeze(worker)  # well within the worker timeout
  try:
    made = session.send_make_array(3, 3, 4)
    check = session.send(check_value_ready_request=lambda b:
                         b.value_handles.append(3))
    session.half_close()
    time.sleep(1.0)
  finally:
    os.kill(worker, signal.SIGCONT)
  assert session.ended(30)
  assert session.error is None, session.error
  assert {made, check} <= session.answered()
  assert _stats(pathways)["ready_checks"] == ready_checks + 1
