"""Channels never block a sender on a peer that does not read, and a peer's
frame header cannot crash the reader: driven through the dispatcher,
executor and peer links over socket pairs (no JAX)."""
import os
import socket
import struct
import threading
import time

import numpy as np
import pytest

from jax_pathways import _core
from socket_pairs import tcp_pair

OpKind = _core.OpKind
MAGIC = 0x4A505746
OP, EVENT, TRANSFER_LOCAL, TRANSFER_ACK, OP_LOCAL, READ_PROBE = 1, 2, 4, 5, 6, 7
HEARTBEAT = 9
TERABYTE = 1 << 40  # the most a header may announce; no test machine has it


def _bounded(fn, timeout_s):
  """Runs fn() on a thread: its seconds, failing (not hanging) past timeout_s."""
  out = {}

  def body():
    start = time.monotonic()
    try:
      fn()
    except Exception as e:  # pylint: disable=broad-except
      out["error"] = e
    out["s"] = time.monotonic() - start

  t = threading.Thread(target=body, daemon=True)
  t.start()
  t.join(timeout_s)
  assert not t.is_alive(), f"still blocked after {timeout_s} s"
  if "error" in out:
    raise out["error"]
  return out["s"]


def _wait_for(predicate, timeout_s=10.0):
  deadline = time.monotonic() + timeout_s
  while not predicate():
    assert time.monotonic() < deadline, "timed out"
    time.sleep(0.01)


def _recv(sock, n):
  parts = []
  while n:
    parts.append(sock.recv(min(n, 1 << 20)))
    assert parts[-1], "connection closed"
    n -= len(parts[-1])
  return b"".join(parts)


def _read_frame(sock):
  """The next frame but the controller's heartbeats (one a second)."""
  while True:
    magic, kind, length = struct.unpack("<IIQ", _recv(sock, 16))
    assert magic == MAGIC
    body = _recv(sock, length)
    if kind != HEARTBEAT:
      return kind, body


def _unread_island(pair="unix"):
  """A dispatcher whose worker socket nobody reads (yet)."""
  a, b = socket.socketpair() if pair == "unix" else tcp_pair()
  d = _core.Dispatcher(4)
  d.add_island(0, a.detach(), "frozen")
  return d, b


def _put(d, result, payload):
  d.submit([(0, OpKind.PUT, 0, [], [result], payload)], 0)


def test_sends_to_a_worker_that_does_not_read_return_at_once_in_order():
  d, worker = _unread_island()
  # 32 MiB of uploads interleaved with small ops: all queued behind the
  # first upload, none overtaking.
  payloads = []
  for i in range(4):
    payloads += [(b"put%d" % i, [np.full(8 << 20, i, np.uint8)]), b"small%d" % i]
  try:
    # Returned while the worker reads nothing (10 s: a hang guard).
    _bounded(lambda: [_put(d, 100 + i, p) for i, p in enumerate(payloads)],
             10)
    assert d.stats()[0]["send_backlog_bytes"] > 30 << 20
    worker.settimeout(10)
    assert _read_frame(worker)[0] == READ_PROBE  # sent by add_island
    for p in payloads:
      kind, body = _read_frame(worker)
      want = p[0] + p[1][0].tobytes() if isinstance(p, tuple) else p
      assert kind == OP and body.endswith(want)
    _wait_for(lambda: d.stats()[0]["send_backlog_bytes"] == 0)
  finally:
    worker.close()
    d.shutdown()


@pytest.mark.parametrize("pair", ["unix", "tcp"])
def test_frames_keep_their_order_while_the_queue_fills_and_drains(pair):
  """A slow reader: sends alternate between the direct write and the queue."""
  a, worker = socket.socketpair() if pair == "unix" else tcp_pair()
  d = _core.Dispatcher(4)
  d.add_island(0, a.detach(), "slow")
  sizes = [(10, 1000, 100_000, 1_500_000)[i % 4] for i in range(120)]
  got = []

  def read():
    while len(got) < len(sizes):
      kind, body = _read_frame(worker)
      if kind == OP:
        got.append(body)
      if len(got) % 8 == 0:
        time.sleep(0.01)

  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  try:
    worker.settimeout(10)
    for i, size in enumerate(sizes):
      _put(d, 1 + i, (b"i%05d" % i, [np.full(size, i % 251, np.uint8)]))
    reader.join(20)
    assert not reader.is_alive() and len(got) == len(sizes)
    for i, (body, size) in enumerate(zip(got, sizes)):
      assert body.endswith(b"i%05d" % i + bytes([i % 251]) * size)
    _wait_for(lambda: d.stats()[0]["send_backlog_bytes"] == 0)
  finally:
    worker.close()
    d.shutdown()


def test_a_worker_that_does_not_read_does_not_block_submit():
  d, worker = _unread_island()
  upload = np.ones(64 << 10, np.uint8)
  try:
    _bounded(lambda: [_put(d, 1000 + i, (b"", [upload])) for i in range(400)],
             10)
    stats = d.stats()[0]
    assert stats["alive"] and stats["submitted"] == 400
    assert stats["send_backlog_bytes"] > 20 << 20  # 25 MiB sent, ~0 read
  finally:
    worker.close()
    d.shutdown()


@pytest.mark.parametrize("pair", ["unix", "tcp"])
def test_shutdown_with_a_backlog_does_not_hang(pair):
  d, worker = _unread_island(pair)
  held = [d]
  try:
    _bounded(lambda: _put(d, 1, (b"", [np.ones(32 << 20, np.uint8)])), 10)
    assert d.stats()[0]["send_backlog_bytes"] > 0
    _bounded(d.shutdown, 5)  # joins the writer blocked in sendmsg
    assert d.stats()[0]["send_backlog_bytes"] == 0
    del d
    _bounded(held.clear, 5)  # the destructor: closes the channel
  finally:
    worker.close()


@pytest.mark.parametrize("pair", ["unix", "tcp"])
def test_a_worker_gone_with_a_backlog_fails_its_island(pair):
  d, worker = _unread_island(pair)
  try:
    _bounded(lambda: _put(d, 1, (b"", [np.ones(32 << 20, np.uint8)])), 10)
    worker.close()  # the writer's sendmsg fails; the reader sees EOF
    _wait_for(lambda: not d.stats()[0]["alive"])
    assert d.stats()[0]["send_backlog_bytes"] == 0
    _put(d, 2, b"late")
    assert d.state(2)[0] == "failed"
  finally:
    d.shutdown()


def test_an_executor_blocked_sending_to_a_controller_that_does_not_read():
  """An executor's events are the caller's bytes: complete() waits for the
  socket (backpressure), and shutdown() releases it."""
  controller, b = socket.socketpair()
  ex = _core.Executor(b.detach())
  done = threading.Event()
  errors = []

  def complete():
    try:
      ex.complete(1, 0, "", np.ones(32 << 20, np.uint8))
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)
    done.set()

  t = threading.Thread(target=complete, daemon=True)
  t.start()
  try:
    assert not done.wait(0.3)  # the socket is full
    _bounded(ex.shutdown, 5)
    assert done.wait(5) and errors
  finally:
    controller.close()


def test_a_header_announcing_a_terabyte_drops_the_connection():
  """Not std::bad_alloc on a reader thread (which would end the process)."""
  header = struct.pack("<IIQ", MAGIC, EVENT, TERABYTE)
  d, worker = _unread_island()
  try:
    worker.sendall(header)
    _wait_for(lambda: not d.stats()[0]["alive"])
    assert "cannot allocate" in d.stats()[0]["error"]
  finally:
    worker.close()
    d.shutdown()

  controller, b = socket.socketpair()
  ex = _core.Executor(b.detach())
  try:
    controller.sendall(struct.pack("<IIQ", MAGIC, OP, TERABYTE))
    with pytest.raises(Exception, match="cannot allocate"):
      ex.next(5.0)
  finally:
    ex.shutdown()
    controller.close()


def test_lent_uploads_of_a_terabyte_drop_the_connection():
  controller, b = socket.socketpair()
  ex = _core.Executor(b.detach())
  try:
    body = struct.pack("<QIQQQ", 0, 1, os.getpid(), 4096, TERABYTE)
    controller.sendall(struct.pack("<IIQ", MAGIC, OP_LOCAL, len(body)) + body)
    with pytest.raises(Exception, match="cannot allocate"):
      ex.next(5.0)
  finally:
    ex.shutdown()
    controller.close()


def test_a_local_transfer_of_a_terabyte_is_refused():
  raw, b = socket.socketpair()
  receiver = _core.PeerLinks()
  receiver.add(b.detach(), "sender")
  try:
    location = struct.pack("<QQQ", os.getpid(), 4096, TERABYTE)
    head = struct.pack("<QiQ", 9, 0, 0) + struct.pack("<Q", 0)  # no time
    pad = (64 - (len(head) + 12) % 64) % 64
    body = (head + struct.pack("<I", pad) + b"\0" * pad +
            struct.pack("<Q", len(location)) + location)
    raw.sendall(struct.pack("<IIQ", MAGIC, TRANSFER_LOCAL, len(body)) + body)
    raw.settimeout(10)
    kind, ack = _read_frame(raw)
    seq, code = struct.unpack("<Qi", ack[:12])
    assert (kind, seq) == (TRANSFER_ACK, 9)
    assert code != 0 and b"cannot allocate" in ack
  finally:
    receiver.shutdown()
    raw.close()


def _trickle(sock, check, chunks=24, chunk=256 << 10, every_s=0.25):
  """One heartbeat frame whose body arrives a chunk at a time, every_s
  apart (its last byte 6 s after its header: three times the timeouts
  below), calling check() after each chunk."""
  sock.sendall(struct.pack("<IIQ", MAGIC, HEARTBEAT, chunks * chunk))
  for _ in range(chunks):
    sock.sendall(b"\0" * chunk)
    check()
    time.sleep(every_s)


def test_a_worker_hears_its_controller_while_a_long_frame_arrives():
  """Issue 52: a worker declared its controller lost ("sent nothing, not
  even a heartbeat") while a large upload's one frame was still arriving
  on a busy machine. Bytes of a frame count; silence after it still
  does."""
  controller, b = socket.socketpair()
  ex = _core.Executor(b.detach(), "the test's controller", 2.0)
  try:
    _trickle(controller, lambda: _check_heard(ex))
    _wait_for(lambda: ex.lost())
    assert "sent nothing, not even a heartbeat" in ex.lost()
  finally:
    ex.shutdown()
    controller.close()


def _check_heard(ex):
  assert not ex.lost(), ex.lost()


def test_a_controller_hears_its_worker_while_a_long_frame_arrives():
  """The same the other way: a worker's long frame (a large fetch's
  event) keeps its island alive while it arrives."""
  d, worker = _unread_island()

  def alive():
    d.expire_silent_islands(2.0)
    [island] = d.stats()
    assert island["alive"], island["error"]

  try:
    _trickle(worker, alive)
    _wait_for(lambda: (d.expire_silent_islands(2.0) or
                       not d.stats()[0]["alive"]))
    assert "sent nothing, not even a heartbeat" in d.stats()[0]["error"]
  finally:
    worker.close()
    d.shutdown()
