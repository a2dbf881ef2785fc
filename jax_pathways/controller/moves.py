"""Moves: fill an array from another on other devices, and free arrays.

Within one island a move is a local copy (or reshard); between islands it is
an exchange: every island holding part of the source pushes the distinct
pieces it holds first to every destination island, worker to worker, never
through the controller.
"""
from __future__ import annotations

from typing import Sequence

from jax_pathways.controller.arrays import Array
from jax_pathways.controller.dispatcher import IslandOp, OpKind
from jax_pathways.controller.gangs import ARG, RESULT, PlannedOp, Schedule
from jax_pathways.controller.launch_context import LaunchContext
from jax_pathways.resources.topology import Topology
from jax_pathways.status import invalid_argument
from jax_pathways.wire import payloads


def move(context: LaunchContext, src: Array, dst: Array) -> None:
  """Fills `dst` (already registered, same shape) with `src`'s values, on
  dst's sharding: within one island a local copy, otherwise an exchange in
  which the bytes go worker to worker. A lone copy is quicker pushed than
  pulled (worker/transfers.py), so it is."""
  one = Schedule(gangs=[])
  sends, receives = one.add_move(planned(context, src, dst, pull=False),
                                 (ARG, 0), (RESULT, 0))
  one.gangs.append(sends + receives)
  one.run(context, [src.buffer], [dst.buffer], None)


# Plans kept (LaunchContext.move_plans; a pipeline's moves, step after step).
PLANS_KEPT = 1024


def planned(context: LaunchContext, src: Array, dst: Array, pull: bool
            ) -> list[PlannedOp]:
  """A move's ops but for its buffers and transfer id, planned once per
  kind of move (islands, shardings, shape, dtype) and dispatcher epoch (a
  lost or rejoined island changes addresses).

  When the source and destination islands are disjoint the receives are
  `later`: a caller that knows when the result is first needed may submit
  them then (a receive holds its island's op loop until the bytes arrive;
  early in the order it would stall work that does not need them).

  pull: let the receiver pull the array (worker/transfers.py) where it can:
  its op loop goes on at once and the launches after it are enqueued ahead
  of the bytes, which is what a pipeline stage wants."""
  key = (context.dispatcher.epoch, tuple(i.id for i in src.islands),
         tuple(i.id for i in dst.islands), src.sharding, dst.sharding,
         tuple(src.shape), src.dtype, tuple(dst.shape), dst.dtype, pull)
  kept = context.move_plans
  ops = kept.get(key)
  if ops is None:
    if len(kept) >= PLANS_KEPT:
      kept.clear()
    ops = kept[key] = _plan(context.topology, src, dst, pull)
  return ops


def _plan(topology: Topology, src: Array, dst: Array, pull: bool
          ) -> list[PlannedOp]:
  sizes = dst.island_bytes(topology)
  if ([i.id for i in src.islands] == [i.id for i in dst.islands] and
      len(src.islands) == 1):
    island = src.islands[0].id
    return [PlannedOp(island, OpKind.COPY, True, False, False,
                      payloads.encode({
                          "mode": "reshard",
                          "sharding": dst.sharding.worker_spec(topology)}),
                      [sizes[island]])]
  if dst.dtype != src.dtype or dst.shape != src.shape:
    raise invalid_argument(
        f"cannot change dtype or shape ({src.dtype}{list(src.shape)} -> "
        f"{dst.dtype}{list(dst.shape)}) while moving between islands")
  source = src.sharding.worker_spec(topology)
  sharding = dst.sharding.worker_spec(topology)
  src_ids = {i.id for i in src.islands}
  dst_ids = {i.id for i in dst.islands}
  # From one island to another, both with transfer servers: the receiver
  # may pull shard by shard (the workers decide, from the same header).
  pull_from = (topology.island(min(src_ids)).transfer_address
               if pull and len(src_ids) == 1 and len(dst_ids) == 1 and
               not src_ids & dst_ids and
               topology.island(min(dst_ids)).transfer_address else "")
  planned = []
  for island in sorted(src_ids | dst_ids):
    header = {
        "source": source, "source_islands": sorted(src_ids),
        "shape": list(src.shape), "dtype": src.dtype,
        "send_to": [{"island": d,
                     "address": topology.island(d).data_address}
                    for d in sorted(dst_ids) if d != island and
                    island in src_ids],
        "sharding": sharding,
        "pull_from": pull_from,
    }
    receive = island in dst_ids
    planned.append(PlannedOp(
        island, OpKind.RECEIVE if receive else OpKind.SEND,
        island in src_ids, receive and not src_ids & dst_ids, True,
        payloads.encode(header), [sizes[island]] if receive else []))
  return planned


def release(context: LaunchContext, arrays: Sequence[Array]) -> None:
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
    context.dispatcher.submit(
        [IslandOp(island, OpKind.DELETE, args=buffers)])
  context.dispatcher.forget(freed)
