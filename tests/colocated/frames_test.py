"""Frames between a worker and its colocated processes: small ones through
the socket, large ones in a sealed memfd; what the other end sends is
checked before it is read."""
from __future__ import annotations

import os
import socket
import struct

import numpy as np
import pytest

from jax_pathways.colocated import frames


@pytest.fixture
def pair():
  a, b = socket.socketpair()
  yield a, b
  a.close()
  b.close()


@pytest.mark.parametrize("nbytes", [100, 3 << 20])
def test_frames_arrive_whole_and_aligned(pair, nbytes):
  a, b = pair
  data = np.arange(nbytes // 4, dtype=np.int32)
  frames.send(a, {"x": 1}, frames.raw(data), b"tail")
  header, (got, tail) = frames.recv(b, 1 << 30)
  assert header == {"x": 1} and bytes(tail) == b"tail"
  arr = np.frombuffer(got, np.int32)
  np.testing.assert_array_equal(arr, data)
  assert arr.ctypes.data % 64 == 0
  arr[0] = 7  # the receiver's own (copy-on-write), the sender's untouched
  assert data[0] == 0


def test_frames_past_the_bound_are_refused(pair):
  a, b = pair
  frames.send(a, {}, b"x" * 4096)
  with pytest.raises(ValueError, match="at most 1024 expected"):
    frames.recv(b, 1024)


def _memfd_frame(a: socket.socket, size: int, data: bytes,
                 seal: bool) -> None:
  fd = os.memfd_create("x", os.MFD_ALLOW_SEALING)
  os.write(fd, data)
  if seal:
    import fcntl  # pylint: disable=import-outside-toplevel
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK |
                fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
  socket.send_fds(a, [struct.pack("<QB", size, 1)], [fd])
  os.close(fd)


def test_a_memfd_that_could_shrink_or_is_not_its_size_is_refused(pair):
  """A frame a hostile process could shrink under its reader (a fault in
  the worker), or whose size is not the one announced, is never mapped."""
  a, b = pair
  _memfd_frame(a, 64, b"\0" * 64, seal=False)
  with pytest.raises(ValueError, match="not sealed at its size"):
    frames.recv(b, 1 << 20)
  _memfd_frame(a, 1 << 16, b"\0" * 64, seal=True)
  with pytest.raises(ValueError, match="not sealed at its size"):
    frames.recv(b, 1 << 20)
  a.sendall(struct.pack("<QB", 8, 1) + b"\0" * 8)  # no descriptor
  with pytest.raises(ValueError, match="without its descriptor"):
    frames.recv(b, 1 << 20)
