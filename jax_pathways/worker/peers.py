"""Peers: this worker's authenticated links to other workers, for array bytes.

Each worker listens on a data address that it reports when it registers. A
worker that must send to a peer connects on first use, authenticates with the
cluster token, and keeps the link; the receiving side knows each incoming link
by the island that opened it. Bytes then move through the C++ PeerLinks
without the GIL.
"""
from __future__ import annotations

import contextlib
import socket
import threading

from absl import logging

from jax_pathways import _core
from jax_pathways import threads
from jax_pathways.cluster import addresses
from jax_pathways.wire import handshake


class Peers:
  """Outgoing and incoming data links of one worker (island)."""

  def __init__(self, token: str | None, listen: str):
    self.links = _core.PeerLinks()
    self.island: int | None = None  # set once the controller assigns it
    self._token = token
    self._mu = threading.Condition()
    self._outgoing: dict[int, int] = {}  # peer island -> link id
    self._incoming: dict[int, int] = {}
    # island -> [(upto, why)]: its workers lost, after this island's op upto.
    self._losses: dict[int, list[tuple[int, str]]] = {}
    # Sockets still in their handshake, per island: lost() shuts them.
    self._connecting: dict[int, set[socket.socket]] = {}
    self._closed = False
    self._listener = addresses.listen(listen)
    self.address = addresses.bound(self._listener)
    self._accepter = threads.start(self._accept_loop, "jp-peer-accept")

  def outgoing(self, island: int, address: str, timeout: float) -> int:
    """The link for sending to `island`, connecting on first use. A dead
    host answers no connect, and a stopped peer accepts the connection (its
    kernel does) but never answers the handshake: lost() ends either
    wait."""
    with self._mu:
      link = self._outgoing.get(island)
      losses = len(self._losses.get(island, ()))
    if link is not None:
      return link
    mine: list[socket.socket] = []

    def made(sock: socket.socket) -> None:
      with self._mu:
        self._check_not_lost(island, losses)
        self._connecting.setdefault(island, set()).add(sock)
      mine.append(sock)

    try:
      sock, _ = addresses.dial(address, self._token,
                               {"role": "peer", "island": self.island},
                               timeout, made)
    finally:
      with self._mu:
        self._connecting.get(island, set()).difference_update(mine)
    with self._mu:
      try:
        self._check_not_lost(island, losses)
      except ConnectionError:
        sock.close()
        raise
      link = self._outgoing.get(island)
      if link is None:
        link = self.links.add(sock.detach(), f"island {island} ({address})")
        self._outgoing[island] = link
      else:
        sock.close()
      return link

  def _check_not_lost(self, island: int, losses: int) -> None:
    """Requires _mu. Raises if `island`'s worker was lost since `losses`
    were counted: what this worker reached was that worker, not the one
    that takes its place."""
    if len(self._losses.get(island, ())) != losses:
      raise ConnectionError(f"worker of island {island} was lost while "
                            "this worker connected to it")

  def incoming(self, island: int, timeout: float) -> int:
    """The link `island` opened to us; waits until it connects."""
    with self._mu:
      if not self._mu.wait_for(
          lambda: island in self._incoming or self._closed, timeout):
        raise TimeoutError(
            f"worker of island {island} did not connect to send data within "
            f"{timeout:.0f} s")
      if island not in self._incoming:
        raise ConnectionError("worker is shutting down")
      return self._incoming[island]

  def lost(self, island: int, upto: int, why: str) -> None:
    """`island`'s worker is lost (PEER_LOST): its links are dead, and a
    worker that takes its place connects (and is connected to) anew. Moves
    from it in this island's ops up to `upto` (numbered before the loss)
    will never come: see loss()."""
    with self._mu:
      links = [self._outgoing.pop(island, None),
               self._incoming.pop(island, None)]
      self._losses.setdefault(island, []).append((upto, why))
      connecting = self._connecting.pop(island, set())
    for sock in connecting:
      with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)  # its handshake fails now
    for link in links:
      if link is not None:
        self.links.close(link, why)  # a stopped peer would hold them

  def loss(self, island: int, seq: int) -> str | None:
    """Why the bytes op `seq` expects from `island` will never come (the
    worker it was numbered for is lost); None while they may."""
    with self._mu:
      for upto, why in self._losses.get(island, ()):
        if seq <= upto:
          return why
    return None

  def close(self) -> None:
    with self._mu:
      self._closed = True
      self._mu.notify_all()
    self._listener.close()
    self.links.shutdown()

  def _accept_loop(self) -> None:
    while True:
      try:
        sock, addr = self._listener.accept()
      except OSError:
        return  # closed
      try:
        hello = handshake.accept(sock, self._token, lambda h: {}, timeout=10)
        if hello.get("role") != "peer" or not isinstance(hello.get("island"), int):
          raise handshake.HandshakeError(f"not a peer worker: {hello}")
      except (OSError, handshake.HandshakeError) as e:
        logging.warning("refused data connection from %s: %s", addr, e)
        sock.close()
        continue
      sock.settimeout(None)
      island = hello["island"]
      link = self.links.add(sock.detach(), f"island {island}")
      with self._mu:
        self._incoming[island] = link
        self._mu.notify_all()
