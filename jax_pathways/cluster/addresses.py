"""Addresses: where a controller, worker or peer listens.

Either "host:port" (TCP; port 0 picks a free one) or "unix:/path" (a Unix
domain socket). The embedded cluster uses Unix sockets in a private
directory: on the 2-core test machine a message over them costs ~11 us of
CPU against ~17 us over loopback TCP, and the directory's permissions keep
other users out.
"""
from __future__ import annotations

import contextlib
import os
import socket
from typing import Any, Callable, Iterator

from jax_pathways.wire import handshake

UNIX = "unix:"


def is_unix(address: str) -> bool:
  return address.startswith(UNIX)


def grpc_url(address: str) -> str:
  """`address` as a URL: grpc:// unless it names a scheme of its own."""
  return address if "://" in address else "grpc://" + address


def dial_target(url: str) -> str:
  """What a gRPC channel dials for `url`: the address without its scheme."""
  return url.split("://", 1)[-1]


def is_loopback(address: str) -> bool:
  if is_unix(address):
    return True
  host = address.rsplit(":", 1)[0].strip("[]")
  return host in ("127.0.0.1", "localhost", "::1")


def _host_port(address: str) -> tuple[str, int]:
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit():
    raise ValueError(f"address {address!r} is neither host:port nor "
                     "unix:/path")
  return host.strip("[]"), int(port)


def endpoints(address: str) -> set[tuple[str, int]]:
  """The (ip, port) pairs TCP `address` resolves to: what getpeername()
  says of a socket connected to it."""
  host, port = _host_port(address)
  return {(info[4][0], port) for info in socket.getaddrinfo(
      host, port, type=socket.SOCK_STREAM)}


def listen(address: str) -> socket.socket:
  if is_unix(address):
    path = address[len(UNIX):]
    if os.path.exists(path):
      os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(128)
    return sock
  return socket.create_server(_host_port(address))


def bound(sock: socket.socket) -> str:
  """The address a listening socket can be reached at."""
  if sock.family == socket.AF_UNIX:
    return UNIX + sock.getsockname()
  host, port = sock.getsockname()[:2]
  return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def connect(address: str, timeout: float,
            made: Callable[[socket.socket], None] | None = None
            ) -> socket.socket:
  """A socket connected to `address`, each of its resolved addresses tried
  for `timeout`. `made` sees every socket before it connects: a dead host
  answers nothing, and only a shutdown() from another thread ends that
  wait early."""
  if is_unix(address):
    targets = [(socket.AF_UNIX, address[len(UNIX):])]
  else:
    targets = [(info[0], info[4]) for info in socket.getaddrinfo(
        *_host_port(address), type=socket.SOCK_STREAM)]
  error: OSError | None = None
  for family, target in targets:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
      sock.settimeout(timeout)
      if made is not None:
        made(sock)
    except BaseException:
      sock.close()
      raise
    try:
      sock.connect(target)
      return sock
    except OSError as e:
      sock.close()
      error = e
  raise error or OSError(f"{address!r} resolves to no address")


def connected_sockets() -> Iterator[tuple[socket.socket, object]]:
  """This process's sockets that have a peer, each as a duplicate (closed
  once the caller moves on) with its getpeername(); listeners and closed
  descriptors are skipped."""
  for name in os.listdir("/proc/self/fd"):
    try:
      if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
        continue
      fd = os.dup(int(name))  # stays valid if the owner closes its own
    except (OSError, ValueError):
      continue  # closed meanwhile
    try:
      sock = socket.socket(fileno=fd)
    except OSError:
      os.close(fd)
      continue  # not a socket after all (the number was reused)
    try:
      peer = sock.getpeername()
    except OSError:
      sock.close()
      continue  # not connected: a listener
    try:
      yield sock, peer
    finally:
      sock.close()


def shut_down_connected(peers: set[object]) -> int:
  """Shuts down this process's stream sockets connected to any of `peers`
  (as getpeername() reports them: a unix path, or (host, port)); returns
  how many."""
  count = 0
  for sock, peer in connected_sockets():
    if isinstance(peer, tuple):
      peer = peer[:2]
    if sock.type == socket.SOCK_STREAM and peer in peers:
      with contextlib.suppress(OSError):  # shut meanwhile
        sock.shutdown(socket.SHUT_RDWR)
        count += 1
  return count


def dial(address: str, token: str | None, hello: dict[str, Any],
         timeout: float,
         made: Callable[[socket.socket], None] | None = None
         ) -> tuple[socket.socket, dict[str, Any]]:
  """A connection to `address` (connect, with `made`) that
  authenticated with `hello`, blocking from then on, and the acceptor's
  welcome. The socket is closed if the handshake fails."""
  sock = connect(address, timeout, made)
  try:
    welcome = handshake.connect(sock, token, hello, timeout)
  except BaseException:
    sock.close()
    raise
  sock.settimeout(None)
  return sock, welcome
