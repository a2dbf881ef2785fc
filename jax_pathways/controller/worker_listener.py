"""WorkerListener: where island workers join the controller.

A worker connects, authenticates with the cluster token (wire/handshake.py),
says how many devices it has and where its data port is, and gets its island
id. Its socket then goes to the C++ dispatcher, which owns it from there on.

A worker may take the place of a lost island's worker (same `--island`,
same number of devices): it becomes the island's next generation and serves
the island's own programs at once. The islands up, it among them, build
the next generation of the islands' global client together (`on_rejoin`,
see controller/coordination.py); the survivors' old one may still have
threads stuck in the lost worker's collectives.

A worker whose connection ended also connects here, as a "probe", to learn
whether the controller is still up and why it dropped the worker (see
worker/join.py): the answer decides the worker's exit code. A worker that
runs programs with callbacks connects here once more, as "callbacks": that
connection goes to the callback router (controller/callback_router.py).
"""
from __future__ import annotations

import contextlib
import socket
from typing import Any, Callable

from absl import logging

from jax_pathways import _core
from jax_pathways import threads
from jax_pathways.cluster import addresses
from jax_pathways.controller.dispatcher import Dispatcher
from jax_pathways.resources.island import Island
from jax_pathways.resources.topology import Topology
from jax_pathways.status import StatusError
from jax_pathways.wire import handshake

HANDSHAKE_TIMEOUT_S = 30.0


class WorkerListener:
  """Accepts, authenticates and registers island workers."""

  def __init__(self, address: str, token: str | None, topology: Topology,
               dispatcher: Dispatcher, reduction_order: str,
               on_rejoin: Callable[[], None],
               on_callbacks: Callable[[socket.socket, int], None]):
    """on_rejoin: a new worker took a lost island's place (it is reachable
    through the dispatcher, not yet connected in the topology).
    on_callbacks(sock, island): a worker's callbacks connection."""
    self._token = token
    self._on_rejoin = on_rejoin
    self._on_callbacks = on_callbacks
    self._reduction_order = reduction_order
    self._topology = topology
    self._dispatcher = dispatcher
    self._sock = addresses.listen(address)
    self.address = addresses.bound(self._sock)

  def start(self) -> None:
    threads.start(self._accept_loop, "jp-workers-in")

  def close(self) -> None:
    # close() alone leaves a socket that a thread is blocked accepting on
    # listening (Linux): a worker's probe was still answered "dropped" on a
    # clean stop, and the worker exited 3 instead of 0.
    with contextlib.suppress(OSError):  # not listening
      self._sock.shutdown(socket.SHUT_RDWR)
    self._sock.close()

  def _accept_loop(self) -> None:
    while True:
      try:
        sock, addr = self._sock.accept()
      except OSError:
        return  # closed
      threads.start(self._join, "jp-worker-join", sock, addr)

  def _join(self, sock: socket.socket, addr: Any) -> None:
    admitted = []
    callbacks = []

    def decide(hello: dict[str, Any]) -> dict[str, Any]:
      if hello.get("role") == "probe":
        return self._probe(hello)
      if hello.get("role") == "callbacks":
        callbacks.append(self._callbacks_of(hello))
        return {}
      if hello.get("role") != "worker":
        raise handshake.HandshakeError("only workers connect here")
      if hello.get("wire_version") != _core.WIRE_VERSION:
        raise handshake.HandshakeError(
            f"worker speaks wire version {hello.get('wire_version')}, the "
            f"controller {_core.WIRE_VERSION}: install the same jax_pathways")
      try:
        island = self._topology.register(hello)
      except ValueError as e:
        raise handshake.HandshakeError(str(e)) from None
      admitted.append(island)
      return {"island": int(island.id),
              "islands": self._topology.expected_islands,
              # Every worker must rewrite programs alike (or gloo hangs).
              "reduction_order": self._reduction_order}

    try:
      handshake.accept(sock, self._token, decide, HANDSHAKE_TIMEOUT_S)
    except handshake.HandshakeError as e:
      logging.warning("refused worker from %s: %s", addr, e)
      sock.close()
      if admitted:  # registered, then the handshake broke: free its place
        self._topology.abandon(admitted[0])
      return
    if callbacks:
      sock.settimeout(None)
      self._on_callbacks(sock, callbacks[0])
      return
    if not admitted:  # a probe, answered
      sock.close()
      return
    island = admitted[0]
    sock.settimeout(None)
    try:
      self._dispatcher.add_island(island.id, sock, island.name,
                                  island.memory_bytes)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("refused %s: %s", island.name, e)  # shutting down
      sock.close()
      self._topology.abandon(island)
      return
    if island.generation:
      logging.info("%s took the lost island's place (generation %d) with "
                   "%d devices", island.name, island.generation,
                   island.num_devices)
      # Before it counts as connected: a program compiled from then on
      # already finds the global client being rebuilt.
      self._on_rejoin()
    else:
      logging.info("%s joined with %d devices", island.name,
                   island.num_devices)
    self._topology.connected(island.id)

  def _callbacks_of(self, hello: dict[str, Any]) -> int:
    """The island of a worker's callbacks connection: its current worker's."""
    island = self._island_of(hello, "callbacks")
    if (island.worker_pid, island.worker_host) != (hello.get("pid"),
                                                   hello.get("host")):
      raise handshake.HandshakeError(
          f"callbacks connection of a worker that is not {island.name}")
    return int(island.id)

  def _island_of(self, hello: dict[str, Any], what: str) -> Island:
    """The island a worker's `what` connection names."""
    try:
      return self._topology.island(int(hello.get("island")))
    except (TypeError, ValueError, StatusError) as e:
      raise handshake.HandshakeError(
          f"{what} for island {hello.get('island')!r}: {e}") from None

  def _probe(self, hello: dict[str, Any]) -> dict[str, Any]:
    """Answers a worker whose connection ended: why it is no longer its
    island's worker (its loss, or who took its place)."""
    island = self._island_of(hello, "probe")
    stats = {s["island"]: s for s in self._dispatcher.stats()}.get(
        island.id, {})
    mine = (island.worker_pid == hello.get("pid") and
            island.worker_host == hello.get("host"))
    alive = bool(stats.get("alive", False))
    if mine and alive:  # its end closed first; the loss is on its way
      why = "its connection ended (the controller had not noticed yet)"
    elif mine:
      why = stats.get("last_lost", "") or "it is lost"
    else:
      why = f"{island.name} has taken its place"
    logging.info("answered a probe of the worker pid %s on %s (island %d): "
                 "%s", hello.get("pid"), hello.get("host"), island.id, why)
    return {"why": why}
