"""Handshake: mutual authentication of a new worker or peer connection.

Both ends prove they hold the cluster token without sending it: each side
sends a fresh nonce and answers the other's with an HMAC-SHA256 over both
nonces and its message. A connection that fails the handshake never reaches
the C++ core. Messages are length-prefixed JSON; every read has a deadline, so
a silent peer cannot hold a thread.

    acceptor                          connector
      {"magic", "nonce": a}   ---->
                              <----   {"hello": {...}, "nonce": b, "mac"}
      {"welcome": {...}, "mac"} ---->      (or {"error": "..."})
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
from typing import Any, Callable

MAGIC = "jax_pathways/1"
_MAX_MESSAGE = 1 << 20


class HandshakeError(Exception):
  """The other end is not (or will not accept) a member of this cluster."""


def _mac(token: str | None, role: str, nonce: str, their_nonce: str,
         message: dict[str, Any]) -> str:
  """What proves that `role`'s `message` comes from a holder of `token`."""
  parts = (role, nonce, their_nonce, json.dumps(message, sort_keys=True))
  key = (token or "").encode()
  return hmac.new(key, "|".join(parts).encode(), hashlib.sha256).hexdigest()


def _signed(reply: dict[str, Any], token: str | None, *parts: Any) -> bool:
  """Whether `reply` carries the mac of `parts` (_mac's, after the token)."""
  return hmac.compare_digest(_mac(token, *parts).encode(),
                             str(reply.get("mac", "")).encode())


def _send(sock: socket.socket, obj: dict[str, Any]) -> None:
  data = json.dumps(obj, separators=(",", ":")).encode()
  sock.sendall(struct.pack("<I", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
  buf = bytearray()
  while len(buf) < n:
    chunk = sock.recv(n - len(buf))
    if not chunk:
      raise HandshakeError("connection closed during handshake")
    buf += chunk
  return bytes(buf)


def _recv(sock: socket.socket) -> dict[str, Any]:
  (n,) = struct.unpack("<I", _recv_exact(sock, 4))
  if n > _MAX_MESSAGE:
    raise HandshakeError("handshake message too large (not a jax_pathways peer?)")
  try:
    obj = json.loads(_recv_exact(sock, n))
  except ValueError as e:
    raise HandshakeError(f"malformed handshake message: {e}") from None
  if not isinstance(obj, dict):
    raise HandshakeError("malformed handshake message")
  return obj


def accept(sock: socket.socket, token: str | None,
           decide: Callable[[dict[str, Any]], dict[str, Any]],
           timeout: float) -> dict[str, Any]:
  """Authenticates a connector; `decide(hello)` returns the welcome or raises
  HandshakeError to refuse. Returns the connector's hello."""
  sock.settimeout(timeout)
  try:
    nonce = os.urandom(16).hex()
    _send(sock, {"magic": MAGIC, "nonce": nonce})
    reply = _recv(sock)
    hello, their_nonce = reply.get("hello"), reply.get("nonce")
    if not isinstance(hello, dict) or not isinstance(their_nonce, str):
      raise HandshakeError("malformed hello")
    if not _signed(reply, token, "connector", nonce, their_nonce, hello):
      _send(sock, {"error": "authentication failed: wrong cluster token"})
      raise HandshakeError("authentication failed: wrong cluster token")
    try:
      welcome = decide(hello)
    except HandshakeError as e:
      _send(sock, {"error": str(e)})
      raise
    _send(sock, {"welcome": welcome,
                 "mac": _mac(token, "acceptor", their_nonce, nonce, welcome)})
    return hello
  except (OSError, struct.error) as e:
    raise HandshakeError(f"handshake failed: {e}") from None


def connect(sock: socket.socket, token: str | None, hello: dict[str, Any],
            timeout: float) -> dict[str, Any]:
  """Authenticates to an acceptor; returns its welcome."""
  sock.settimeout(timeout)
  try:
    first = _recv(sock)
    if first.get("magic") != MAGIC or not isinstance(first.get("nonce"), str):
      raise HandshakeError(
          f"the other end does not speak {MAGIC} (got {str(first)[:80]})")
    nonce = os.urandom(16).hex()
    _send(sock, {"hello": hello, "nonce": nonce,
                 "mac": _mac(token, "connector", first["nonce"], nonce,
                             hello)})
    reply = _recv(sock)
    if "error" in reply:
      raise HandshakeError(str(reply["error"]))
    welcome = reply.get("welcome")
    if not isinstance(welcome, dict):
      raise HandshakeError("malformed welcome")
    if not _signed(reply, token, "acceptor", nonce, first["nonce"], welcome):
      raise HandshakeError("the other end does not hold the cluster token")
    return welcome
  except (OSError, struct.error) as e:
    raise HandshakeError(f"handshake failed: {e}") from None
