"""Mutual token authentication of worker and peer connections."""
import socket
import threading

import pytest

from jax_pathways.wire import handshake


def _run(server_token, client_token, decide=lambda hello: {"island": 3}):
  a, b = socket.socketpair()
  result = {}

  def serve():
    try:
      result["hello"] = handshake.accept(a, server_token, decide, timeout=5)
    except handshake.HandshakeError as e:
      result["server_error"] = str(e)

  t = threading.Thread(target=serve)
  t.start()
  try:
    result["welcome"] = handshake.connect(b, client_token, {"role": "worker"},
                                          timeout=5)
  except handshake.HandshakeError as e:
    result["client_error"] = str(e)
  t.join(10)
  a.close()
  b.close()
  return result


def test_same_token_connects():
  r = _run("s3cret", "s3cret")
  assert r["hello"] == {"role": "worker"} and r["welcome"] == {"island": 3}


def test_wrong_token_is_refused_on_both_sides():
  r = _run("s3cret", "guess")
  assert "wrong cluster token" in r["server_error"]
  assert "wrong cluster token" in r["client_error"]


def test_refusal_reason_reaches_the_connector():
  def decide(hello):
    raise handshake.HandshakeError("island 0 already has a worker")
  r = _run(None, None, decide)
  assert r["client_error"] == "island 0 already has a worker"


def test_not_a_peer():
  a, b = socket.socketpair()
  b.sendall(b"GET / HTTP/1.1\r\n\r\n")
  with pytest.raises(handshake.HandshakeError):
    handshake.accept(a, "t", lambda h: {}, timeout=2)
  a.close()
  b.close()


def test_silent_peer_times_out():
  a, b = socket.socketpair()
  with pytest.raises(handshake.HandshakeError, match="timed out"):
    handshake.connect(a, "t", {}, timeout=0.2)
  a.close()
  b.close()
