"""Transfers: arrays pulled device to device between islands, as futures.

Each worker runs jaxlib's transfer server on its island client. The sending
island offers an array under the move's transfer id (even one not computed
yet: the server sends it once it is ready); the receiving island pulls it
and gets, at once, an array whose buffers are defined when the bytes have
arrived. A launch on it is enqueued before the data exists, so a pipeline
stage's next fragment starts when its input lands, with no Python on either
side in between (docs/benchmarks.md, B4). A failed source is offered as an
error array: the puller's array, and every launch on it, fail with its
message. A sender that dies fails the pull within about a second; one that
is stopped would hold it for ever (and this device: CPU launches run in
order, the one on the pulled array first), so once the controller declares
that worker lost, cut() ends this worker's connections to it, and its pulls
fail at once.

What to wait on for a pull is `arrival(pulled)`, not the pulled array:
the fragment enqueued on it usually donates it, and a donated array reads
as ready at once (the trace would start that fragment before its data, and
a pull that never comes would escape the watchdog).
"""
from __future__ import annotations

import threading
from typing import Any

from absl import logging

import jax
import jax.numpy as jnp
from jax.experimental import transfer

from jax_pathways.cluster import addresses
from jax_pathways.status import Status


# One element of each piece: a launch that cannot run before the piece's
# bytes have landed (nor before the launches enqueued on its device earlier).
_FIRST_ELEMENT = jax.jit(lambda x: jnp.ravel(x)[:1])


def arrival(pulled: jax.Array) -> list[jax.Array]:
  """Arrays ready once `pulled`'s bytes have landed on every local device,
  which stay valid when a later launch donates `pulled`. Enqueue them before
  that launch."""
  if len(pulled.sharding.device_set) == 1:
    return [_FIRST_ELEMENT(pulled)]
  return [_FIRST_ELEMENT(shard.data) for shard in pulled.addressable_shards]


class Transfers:
  """This worker's transfer server and its connections to other workers'."""

  def __init__(self, client: Any, host: str):
    self._server = transfer.start_transfer_server(client, f"{host}:0",
                                                  [f"{host}:0"])
    self.address: str = self._server.address()
    self._mu = threading.Lock()
    self._connections: dict[str, Any] = {}
    self._addresses: dict[int, str] = {}  # island -> its transfer server

  def offer(self, transfer_id: int, source: jax.Array | Status,
            aval: jax.ShapeDtypeStruct) -> None:
    """Lets one puller take `source` (or its error) once it is ready."""
    if isinstance(source, Status):
      source = transfer.make_error_array(aval, str(source))
    self._server.await_pull(transfer_id, [source])

  def pull(self, transfer_id: int, island: int, address: str,
           aval: jax.ShapeDtypeStruct) -> jax.Array:
    """The array `island`'s worker offers at `address` as `transfer_id`,
    still arriving. Nothing bounds the wait for an offer that never comes
    (jaxlib 0.10.2 ignores pull's timeout): whoever waits on it must bound
    it, and cut() ends it once that worker is lost."""
    with self._mu:
      connection = self._connections.get(address)
      if connection is None:
        connection = self._server.connect(address)
        self._connections[address] = connection
        self._addresses[island] = address
    array, = connection.pull(transfer_id, [aval])
    return array

  def cut(self, island: int) -> None:
    """`island`'s worker is lost: pulls from it fail now ("Connection
    closed"), not when (if ever) its process ends. jaxlib has no call for
    it, so this shuts down the sockets to its server (shutdown, not close:
    the transfer server still owns them and closes them itself)."""
    with self._mu:
      address = self._addresses.pop(island, None)
      if address is None or self._connections.pop(address, None) is None:
        return
    try:
      peers = addresses.endpoints(address)
    except (OSError, ValueError) as e:
      logging.warning("transfers: cannot cut %s: %s", address, e)
      return
    try:
      cut = addresses.shut_down_connected(peers)
    except OSError as e:  # not Linux: pulls end when the process does
      logging.warning("transfers: cannot list this process's sockets: %s", e)
      cut = 0
    logging.info("transfers: cut %d connection(s) to island %d's worker at "
                 "%s", cut, island, address)
