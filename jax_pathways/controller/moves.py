"""Moves: fill an array from another on other devices, and free arrays.

Within one island a move is a local copy (or reshard); between islands it is
an exchange: every island holding part of the source pushes the distinct
pieces it holds first to every destination island, worker to worker, never
through the controller.
"""
from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Sequence

from jax_pathways.controller.arrays import Array
from jax_pathways.dispatch import payloads
from jax_pathways.dispatch.dispatcher import IslandOp, OpKind
from jax_pathways.status import invalid_argument

if TYPE_CHECKING:
  from jax_pathways.controller.session import Services


def move(services: Services, src: Array, dst: Array) -> None:
  """Fills `dst` (already registered, same shape) with `src`'s values, on
  dst's sharding: within one island a local copy, otherwise an exchange in
  which the bytes go worker to worker."""
  sends, receives = plan(services, src, dst)
  services.dispatcher.submit(list(sends) + list(receives))


def plan(services: Services, src: Array, dst: Array, pull: bool = False
         ) -> tuple[list[IslandOp], list[IslandOp]]:
  """The ops of a move, as (sends, receives): two gangs when the source and
  destination islands are disjoint, so a caller that knows when the result
  is first needed can submit the receives then (a receive holds its
  island's op loop until the bytes arrive; early in the order it would
  stall work that does not need them). Otherwise all in `sends`.

  pull: let the receiver pull the array (worker/transfers.py) where it can:
  its op loop goes on at once and the launches after it are enqueued ahead
  of the bytes, which is what a pipeline stage wants; a lone copy is
  quicker pushed."""
  topology = services.topology
  sizes = dst.island_bytes(topology)
  if ([i.id for i in src.islands] == [i.id for i in dst.islands] and
      len(src.islands) == 1):
    return [IslandOp(src.islands[0].id, OpKind.COPY, args=[src.buffer],
                     results=[dst.buffer],
                     payload=payloads.encode({
                         "mode": "reshard",
                         "sharding": dst.sharding.worker_spec(topology)}),
                     result_bytes=[sizes[src.islands[0].id]])], []
  if dst.dtype != src.dtype or dst.shape != src.shape:
    raise invalid_argument(
        f"cannot change dtype or shape ({src.dtype}{list(src.shape)} -> "
        f"{dst.dtype}{list(dst.shape)}) while moving between islands")
  source = src.sharding.worker_spec(topology)
  # Pieces travel as transfer, transfer + 1, ...: random, so no transfer of
  # anyone else can collide with (or guess) these.
  transfer = secrets.randbits(40) << 20
  src_ids = {i.id for i in src.islands}
  dst_ids = {i.id for i in dst.islands}
  # From one island to another, both with transfer servers: the receiver
  # may pull shard by shard (the workers decide, from the same header).
  pull_from = (topology.island(min(src_ids)).transfer_address
               if pull and len(src_ids) == 1 and len(dst_ids) == 1 and
               not src_ids & dst_ids and
               topology.island(min(dst_ids)).transfer_address else "")
  # A failed source (its island lost, or its producer failed) fails the
  # receivers at once too: the dispatcher refuses a gang that names a
  # failed buffer, as it refuses the sends. Otherwise a receiver holding
  # none of it would pull from a lost worker's transfer server (INTERNAL,
  # not the loss) or wait for a push that never comes.
  failed = services.dispatcher.state(src.buffer)[0] == "failed"
  sends, receives = [], []
  for island in sorted(src_ids | dst_ids):
    header = {
        "source": source, "source_islands": sorted(src_ids),
        "shape": list(src.shape), "dtype": src.dtype, "transfer": transfer,
        "send_to": [{"island": d,
                     "address": topology.island(d).data_address}
                    for d in sorted(dst_ids) if d != island and
                    island in src_ids],
        "sharding": dst.sharding.worker_spec(topology),
        "pull_from": pull_from,
    }
    receive = island in dst_ids
    op = IslandOp(
        island, OpKind.RECEIVE if receive else OpKind.SEND,
        args=[src.buffer] if island in src_ids or failed else [],
        results=[dst.buffer] if receive else [],
        payload=payloads.encode(header),
        result_bytes=[sizes[island]] if receive else [])
    (receives if receive and not src_ids & dst_ids else sends).append(op)
  return sends, receives


def release(services: Services, arrays: Sequence[Array]) -> None:
  """Lets the arrays go: buffers nobody holds any more get a DELETE (after
  the ops already queued that use them) and leave the dispatcher's books."""
  by_island: dict[int, list[int]] = {}
  freed = []
  for array in arrays:
    if array.release():
      freed.append(array.buffer)
      for island in array.islands:
        by_island.setdefault(island.id, []).append(array.buffer)
  for island, buffers in by_island.items():
    services.dispatcher.submit(
        [IslandOp(island, OpKind.DELETE, args=buffers)])
  services.dispatcher.forget(freed)
