"""ColocatedExecutable: a colocated_python function, run beside the islands of its devices.

One launch is one gang: a COLOCATED op on every island of the function's
devices, at the same place in each island's order as any launch (a call
sees the values every launch before it made). Each island's worker hands
its shards of the arguments to the client's colocated process there and
makes its shards of the results from what the function returned; the
controller sends the function's pickle and where the shards are, never
bytes of the arrays. Dropping the executable drops the function in those
processes; the session's end ends the processes.
"""
from __future__ import annotations

from typing import Any, Sequence

from jax_pathways.controller.arrays import Array, island_bytes
from jax_pathways.controller.dispatcher import IslandOp, OpKind
from jax_pathways.controller import uncompiled
from jax_pathways.controller.launch_context import LaunchContext
from jax_pathways.programs.colocated_program import ArraySpec, ColocatedProgram
from jax_pathways.programs.sharding import Sharding
from jax_pathways.resources.topology import Topology
from jax_pathways.resources.virtual_slice import VirtualSlice
from jax_pathways.wire import payloads

OnDone = Any  # (status, *_), as launches report


class ColocatedExecutable:
  """One compiled colocated_python function, as the execute handler sees an
  executable."""

  donated: tuple[int, ...] = ()

  def __init__(self, program: ColocatedProgram, slice_: VirtualSlice,
               topology: Topology, client: int, packages: str | None):
    self._program = program
    self._client = client
    self._topology = topology
    self._physical = slice_.physical(program.devices)
    self._islands = [int(i.id) for i in topology.islands_of(
        self._physical, "the colocated_python function's devices")]
    self._inputs = [slice_.physical_sharding(s.sharding)
                    for s in program.inputs]
    self._virtual = slice_.virtual
    self.output_shardings = [slice_.physical_sharding(s.sharding)
                             for s in program.outputs]
    self.output_islands = [tuple(topology.islands_of(s.devices, f"output {j}"))
                           for j, s in enumerate(self.output_shardings)]
    self.outputs = [(s.shape, s.dtype) for s in program.outputs]
    self.num_parameters = len(program.inputs)
    self.devices = tuple(sorted(self._physical))
    self.islands = tuple(self._islands)
    self._hello = _hello(slice_, topology, packages)
    self.metadata = uncompiled.metadata(
        program.name or "colocated_python",
        [len(shape) for shape, _ in self.outputs])

  def programs(self) -> list[Any]:
    """It holds no compiled program (drop() lets its function go)."""
    return []

  def check_argument(self, i: int, array: Array) -> None:
    spec: ArraySpec = self._program.inputs[i]
    array.check_fits(i, frozenset(self._inputs[i].devices),
                     (spec.shape, spec.dtype), self._inputs[i])

  def launch(self, context: LaunchContext, args: Sequence[Array],
             results: Sequence[int], on_done: OnDone | None) -> None:
    """A COLOCATED op on every island of the function's devices."""
    inputs = [self._described(a.sharding) for a in args]
    gang = []
    for island in self._islands:
      held = [j for j, islands in enumerate(self.output_islands)
              if any(int(i.id) == island for i in islands)]
      header = {
          "action": "call", "client": self._client,
          "function": self._program.key, "hello": self._node(island),
          "inputs": inputs,
          "outputs": [{"shape": list(self.outputs[j][0]),
                       "dtype": self.outputs[j][1],
                       **self._described(self.output_shardings[j])}
                      for j in held]}
      gang.append(IslandOp(
          island, OpKind.COLOCATED, args=[a.buffer for a in args],
          results=[results[j] for j in held],
          payload=payloads.encode(header, self._program.pickled),
          result_bytes=[self._bytes(j).get(island, 0) for j in held]))
    context.dispatcher.submit(gang, on_done)

  def drop(self, context: LaunchContext) -> None:
    """The client let it go: so do the colocated processes."""
    header = {"action": "drop", "client": self._client,
              "function": self._program.key}
    context.dispatcher.submit([IslandOp(i, OpKind.COLOCATED,
                                        payload=payloads.encode(header))
                               for i in self._islands])

  def _described(self, sharding: Sharding) -> dict[str, Any]:
    spec = sharding.worker_spec(self._topology)
    return {"sharding": spec,
            "virtual": list(self._virtual(sharding.devices))}

  def _node(self, island: int) -> dict[str, Any]:
    return {**self._hello, "node": self._hello["islands"].index(island)}

  def _bytes(self, j: int) -> dict[int, int]:
    shape, dtype = self.outputs[j]
    return island_bytes(dtype, shape, self.output_shardings[j],
                        self._topology)


def end(context: LaunchContext, client: int, islands: Sequence[int]) -> None:
  """Client `client`'s session ended: its colocated processes go."""
  header = payloads.encode({"action": "end", "client": client})
  context.dispatcher.submit([IslandOp(i, OpKind.COLOCATED, payload=header)
                             for i in sorted(islands)])


def _hello(slice_: VirtualSlice, topology: Topology, packages: str | None
           ) -> dict[str, Any]:
  """What a colocated process is told first: the client's devices as a
  job of one node per island (colocated/device_view.py)."""
  by_island: dict[int, list[tuple[int, int]]] = {}
  for virtual, physical in enumerate(slice_.physical_ids):
    island = topology.island_of_device(physical)
    by_island.setdefault(int(island.id), []).append(
        (island.local_index(physical), virtual))
  islands = sorted(by_island)
  devices = []
  for node, island in enumerate(islands):
    for index, (_, virtual) in enumerate(sorted(by_island[island])):
      devices.append([virtual, node, index])
  return {"islands": islands, "counts": [len(by_island[i]) for i in islands],
          "devices": devices, "client_packages": packages}
