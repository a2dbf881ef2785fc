"""Frames between a worker and its colocated processes: a u64 length, then a payload.

The payload is wire/payloads.py's (a JSON header and 64-byte aligned
blobs), so shard bytes are neither pickled nor encoded, and arrive aligned.
Both ends are this package's; the executor still runs a user's code, so the
worker bounds what it reads (max_bytes) and checks every shard's size.
"""
from __future__ import annotations

import socket
import struct
from typing import Any

import numpy as np

from jax_pathways.wire import payloads

_U64 = struct.Struct("<Q")


class Closed(ConnectionError):
  """The other end closed the connection (or died)."""


def raw(array: np.ndarray) -> memoryview:
  """An array's bytes, as a blob (bfloat16 and its kin have no buffer
  format; their bytes do)."""
  return memoryview(np.asarray(array, order="C").reshape(-1).view(np.uint8))


def send(sock: socket.socket, header: dict[str, Any], *blobs: Any) -> None:
  head, tails = payloads.parts(header, *blobs)
  size = len(head) + sum(memoryview(t).nbytes for t in tails)
  sock.sendall(_U64.pack(size) + head)
  for tail in tails:
    sock.sendall(tail)


def recv(sock: socket.socket, max_bytes: int
         ) -> tuple[dict[str, Any], list[memoryview]]:
  """The next frame's header and blobs (views into one aligned buffer)."""
  (size,) = _U64.unpack(_read(sock, _U64.size))
  if size > max_bytes:
    raise ValueError(f"a frame of {size} bytes; at most {max_bytes} expected")
  raw = np.empty(size + payloads.ALIGN, np.uint8)
  start = -raw.ctypes.data % payloads.ALIGN
  view = memoryview(raw[start:start + size])
  got = 0
  while got < size:
    n = sock.recv_into(view[got:], size - got)
    if n == 0:
      raise Closed("the connection closed mid-frame")
    got += n
  return payloads.decode(view)


def _read(sock: socket.socket, n: int) -> bytes:
  out = b""
  while len(out) < n:
    chunk = sock.recv(n - len(out))
    if not chunk:
      raise Closed("the connection closed")
    out += chunk
  return out
