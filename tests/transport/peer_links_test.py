"""Worker-to-worker links: bytes over TCP, and on one host a copy straight
out of the sender's memory (process_vm_readv) that a refusal cannot break."""
import socket
import struct
import threading

import numpy as np
import pytest

from jax_pathways import _core
from socket_pairs import tcp_pair

MAGIC = 0x4A505746
TRANSFER_LOCAL, TRANSFER_ACK = 4, 5


def _links(a, b):
  sender, receiver = _core.PeerLinks(), _core.PeerLinks()
  out = sender.add(a.detach(), "receiver")
  into = receiver.add(b.detach(), "sender")
  return sender, out, receiver, into


@pytest.mark.parametrize("pair", ["unix", "tcp"])
@pytest.mark.parametrize("size", [4 << 10, 3 << 20])
def test_bytes_arrive_whole(pair, size):
  a, b = socket.socketpair() if pair == "unix" else tcp_pair()
  sender, out, receiver, into = _links(a, b)
  data = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)
  try:
    sender.send(out, 7, 0, "", data)   # a large unix one: a local copy
    sender.send(out, 8, 13, "the source failed", b"")
    got = receiver.receive(into, 7, 10.0)
    assert got.tobytes() == data.tobytes()
    assert got.ctypes.data % 64 == 0   # aligned: devices can alias it
    with pytest.raises(Exception, match="the source failed"):
      receiver.receive(into, 8, 10.0)
  finally:
    sender.shutdown()
    receiver.shutdown()


def _frame(kind, seq, payload):
  message = b""
  # An event head (messages.cc): seq, code, message, device time.
  head = (struct.pack("<QiQ", seq, 0, len(message)) + message +
          struct.pack("<Q", 0))
  used = len(head) + 4 + 8
  pad = (64 - used % 64) % 64
  body = head + struct.pack("<I", pad) + b"\0" * pad + struct.pack(
      "<Q", len(payload)) + payload
  return struct.pack("<IIQ", MAGIC, kind, len(body)) + body


def test_a_refused_local_copy_is_acknowledged_as_failed():
  raw, b = socket.socketpair()
  receiver = _core.PeerLinks()
  into = receiver.add(b.detach(), "sender")
  try:
    # Bytes "held" by a process that does not exist.
    raw.sendall(_frame(TRANSFER_LOCAL, 9, struct.pack("<QQQ", 2**22 + 12345,
                                                      4096, 1 << 20)))
    raw.settimeout(10)
    header = raw.recv(16, socket.MSG_WAITALL)
    magic, kind, length = struct.unpack("<IIQ", header)
    body = raw.recv(length, socket.MSG_WAITALL)
    seq, code = struct.unpack("<Qi", body[:12])
    assert (magic, kind, seq) == (MAGIC, TRANSFER_ACK, 9)
    assert code != 0 and b"process_vm_readv" in body
    # Nothing arrived: the sender sends the bytes instead.
    with pytest.raises(Exception, match="did not arrive"):
      receiver.receive(into, 9, 0.2)
  finally:
    receiver.shutdown()
    raw.close()


@pytest.mark.parametrize("pair", ["unix", "tcp"])
def test_a_closed_link_fails_its_waits_at_once(pair):
  """A stopped peer keeps its socket open and reads nothing: once it is
  declared lost, close() ends a send blocked on it (a full socket, or a
  local copy's ack that never comes) and a receive waiting for its bytes."""
  a, b = socket.socketpair() if pair == "unix" else tcp_pair()
  raw = b  # the "peer": never reads
  sender = _core.PeerLinks()
  out = sender.add(a.detach(), "island 1")
  data = np.zeros(64 << 20, np.uint8)  # more than the socket takes
  failed = []

  def send():
    try:
      sender.send(out, 7, 0, "", data)
    except Exception as e:  # pylint: disable=broad-except
      failed.append(str(e))

  try:
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive()  # blocked on the peer
    sender.close(out, "island 1 is lost")
    thread.join(10)
    assert not thread.is_alive()
    assert failed and "closed: island 1 is lost" in failed[0], failed
    with pytest.raises(Exception, match="closed: island 1 is lost"):
      sender.receive(out, 8, 10.0)  # at once, not after 10 s
    with pytest.raises(Exception, match="closed: island 1 is lost"):
      sender.send(out, 9, 0, "", b"x")
  finally:
    sender.shutdown()
    raw.close()
