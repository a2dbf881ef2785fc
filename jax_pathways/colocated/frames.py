"""Frames between a worker and its colocated processes: a length, then a payload.

The payload is wire/payloads.py's (a JSON header and 64-byte aligned
blobs), so shard bytes are neither pickled nor encoded, and arrive aligned.
A large payload does not go through the socket: the sender writes it once
into a memfd, seals it (no write, grow or shrink after) and passes the
descriptor; the receiver maps it (copy-on-write), so the bytes are copied
once on their way, not twice (socket), and not by the receiver. Both ends are
this package's; the executor still runs a user's code, so the worker
bounds what it reads (max_bytes), takes only a sealed memfd of the size
announced (a shrunk one would fault its reader), and checks every shard's
size.
"""
from __future__ import annotations

import fcntl
import json
import math
import mmap
import os
import socket
import struct
from typing import Any, Sequence

import numpy as np

from jax_pathways.wire import payloads

# u64 payload size, u8 how it travels.
_PREFIX = struct.Struct("<QB")
_INLINE, _MEMFD = 0, 1
# Payloads from this size on travel in a memfd.
MEMFD_MIN_BYTES = 1 << 20
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


class Closed(ConnectionError):
  """The other end closed the connection (or died)."""


def raw(array: np.ndarray) -> memoryview:
  """An array's bytes, as a blob (bfloat16 and its kin have no buffer
  format; their bytes do)."""
  return memoryview(np.asarray(array, order="C").reshape(-1).view(np.uint8))


def strings(shard: np.ndarray) -> bytes:
  """A string shard (numpy StringDType) as a blob: a JSON list."""
  return json.dumps([str(s) for s in shard.flat]).encode()


def strings_shard(blob: Any, shape: Sequence[int]) -> np.ndarray:
  """strings()'s blob as a shard of `shape`, checked (ValueError)."""
  values = json.loads(bytes(blob))
  if not isinstance(values, list) or len(values) != math.prod(shape) or (
      not all(isinstance(v, str) for v in values)):
    raise ValueError(f"a string shard of shape {list(shape)} must be "
                     f"{math.prod(shape)} strings")
  return np.array(values, dtype=np.dtypes.StringDType()).reshape(
      tuple(shape))


def send(sock: socket.socket, header: dict[str, Any], *blobs: Any) -> None:
  head, tails = payloads.parts(header, *blobs)
  size = len(head) + sum(memoryview(t).nbytes for t in tails)
  if size < MEMFD_MIN_BYTES:
    sock.sendall(_PREFIX.pack(size, _INLINE) + head)
    for tail in tails:
      sock.sendall(tail)
    return
  fd = os.memfd_create("jp-colocated-frame",
                       os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
  try:
    os.ftruncate(fd, size)
    with mmap.mmap(fd, size) as out:
      at = 0
      for part in (head, *tails):
        view = memoryview(part).cast("B")
        out[at:at + view.nbytes] = view
        at += view.nbytes
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    socket.send_fds(sock, [_PREFIX.pack(size, _MEMFD)], [fd])
  finally:
    os.close(fd)


def recv(sock: socket.socket, max_bytes: int
         ) -> tuple[dict[str, Any], list[memoryview]]:
  """The next frame's header and blobs (views into one aligned buffer, or
  into the sender's sealed memfd)."""
  prefix, fds = b"", []
  try:
    while len(prefix) < _PREFIX.size:
      data, got, _, _ = socket.recv_fds(sock, _PREFIX.size - len(prefix), 1)
      fds += got
      if not data:
        raise Closed("the connection closed")
      prefix += data
    size, kind = _PREFIX.unpack(prefix)
    if size > max_bytes:
      raise ValueError(f"a frame of {size} bytes; at most {max_bytes} "
                       "expected")
    if kind == _MEMFD:
      if len(fds) != 1:
        raise ValueError("a memfd frame without its descriptor")
      return payloads.decode(_mapped(fds[0], size))
    if kind != _INLINE or fds:
      raise ValueError(f"a frame of kind {kind} with {len(fds)} descriptors")
    return payloads.decode(_read(sock, size))
  finally:
    for fd in fds:
      os.close(fd)


def _mapped(fd: int, size: int) -> memoryview:
  """The sender's memfd, if sealed at the size it announced: mapped
  copy-on-write, so arrays made on it (PJRT may alias them) may be written
  like any other."""
  seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
  if seals & _SEALS != _SEALS or os.fstat(fd).st_size != size:
    raise ValueError("a memfd frame that is not sealed at its size")
  return memoryview(mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE,
                              prot=mmap.PROT_READ | mmap.PROT_WRITE))


def _read(sock: socket.socket, size: int) -> memoryview:
  raw_bytes = np.empty(size + payloads.ALIGN, np.uint8)
  start = -raw_bytes.ctypes.data % payloads.ALIGN
  view = memoryview(raw_bytes[start:start + size])
  got = 0
  while got < size:
    n = sock.recv_into(view[got:], size - got)
    if n == 0:
      raise Closed("the connection closed mid-frame")
    got += n
  return view
