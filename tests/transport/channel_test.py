"""A peer's frame header cannot crash the reader: driven through the
dispatcher, executor and peer links over socket pairs (no JAX)."""
import os
import socket
import struct
import time

import pytest

from jax_pathways import _core

MAGIC = 0x4A505746
OP, EVENT, TRANSFER_LOCAL, TRANSFER_ACK, OP_LOCAL, READ_PROBE = 1, 2, 4, 5, 6, 7
TERABYTE = 1 << 40  # the most a header may announce; no test machine has it


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
  magic, kind, length = struct.unpack("<IIQ", _recv(sock, 16))
  assert magic == MAGIC
  return kind, _recv(sock, length)


def _unread_island():
  """A dispatcher whose worker socket nobody reads (yet)."""
  a, b = socket.socketpair()
  d = _core.Dispatcher(4)
  d.add_island(0, a.detach(), "frozen")
  return d, b


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
    body = struct.pack("<IQQQ", 1, os.getpid(), 4096, TERABYTE)
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
    head = struct.pack("<QiQ", 9, 0, 0)
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
