"""Coordination: the service behind the islands' global client.

When a cluster has several islands, every worker also joins one multi-process
PJRT client (jaxlib's distributed CPU client, collectives over gloo) so that a
program can span islands. Its coordination service runs here, in the
controller, so that no worker's death takes it down; it is "recoverable":
a worker that dies does not bring the others down with it.
"""
from __future__ import annotations

import socket

from absl import logging

from jax_pathways.cluster import addresses

HEARTBEAT_TIMEOUT_S = 30


def _free_port(host: str) -> int:
  with socket.create_server((host, 0)) as s:
    return s.getsockname()[1]


class Coordinator:
  """jaxlib's distributed runtime service for `islands` workers."""

  def __init__(self, islands: int, address: str):
    if not addresses.is_unix(address):
      host, _, port = address.rpartition(":")
      if port == "0":  # the service needs a concrete port
        address = f"{host}:{_free_port(host.strip('[]'))}"
    from jaxlib import _jax  # pylint: disable=import-outside-toplevel
    self.service = _jax.get_distributed_runtime_service(
        address, islands, heartbeat_timeout=HEARTBEAT_TIMEOUT_S,
        recoverable=True)
    self.address = address
    logging.info("coordination service for %d islands at %s", islands,
                 address)

  def shutdown(self) -> None:
    self.service.shutdown()
