"""The client's devices as a colocated process sees them: a multi-process JAX job.

orbax and MaxText write colocated functions as multi-controller JAX code:
`jax.devices()` is every device of the job, the arrays a function gets hold
this host's shards (`addressable_shards`), and `jax.process_index()` tells
hosts apart (orbax names its OCDBT files by it). So the colocated process
of island k is node k of a job with one node per island of the client's
slice, each with that island's devices of the slice. Its peers' devices
exist only as names: jaxlib's CPU client learns them through a topology
exchange, which this process holds with itself (a coordination service on
a private Unix socket, one CPU client per node); nothing crosses hosts.

The client pickles devices by its own ids (colocated_python/serialization);
its ids are not this client's, so that module's device lookup and device
reducers are mapped both ways here.
"""
from __future__ import annotations

import os
import tempfile
import threading
from typing import Any, Sequence

import numpy as np

# How long the in-process topology exchange may take.
_EXCHANGE_TIMEOUT_S = 60


class DeviceView:
  """This process's JAX backend, and the client's ids of its devices."""

  def __init__(self, node: int, counts: Sequence[int],
               devices: Sequence[tuple[int, int, int]]):
    """node: this island's position among the slice's islands; counts: the
    slice's devices on each; devices: (client id, node, index) each."""
    from jax._src.lib import xla_client  # pylint: disable=import-outside-toplevel
    self.node = node
    self._keep: list[Any] = []  # the peers' clients: alive as long as ours
    if len(counts) == 1:
      self.client = xla_client.make_cpu_client(asynchronous=True,
                                               num_devices=counts[0])
    else:
      self.client = self._exchange(node, counts)
    by_node: dict[int, list[Any]] = {}
    for d in self.client.devices():
      by_node.setdefault(d.process_index, []).append(d)
    for ds in by_node.values():
      ds.sort(key=lambda d: d.id)
    self.by_client_id = {cid: by_node[n][i] for cid, n, i in devices}
    self.client_id = {d.id: cid for cid, d in self.by_client_id.items()}

  def _exchange(self, node: int, counts: Sequence[int]) -> Any:
    from jax._src.lib import _jax, xla_client  # pylint: disable=import-outside-toplevel
    # A private directory: no other process can reach the service.
    directory = tempfile.mkdtemp(prefix="jp-colocated-")
    address = f"unix:{os.path.join(directory, 'topology')}"
    service = _jax.get_distributed_runtime_service(address, len(counts))
    clients: dict[int, Any] = {}
    errors: list[BaseException] = []

    def join(k: int) -> None:
      try:
        distributed = _jax.get_distributed_runtime_client(
            address, k, init_timeout=_EXCHANGE_TIMEOUT_S,
            shutdown_on_destruction=False)
        distributed.connect()
        clients[k] = xla_client.make_cpu_client(
            asynchronous=True, distributed_client=distributed, node_id=k,
            num_nodes=len(counts), num_devices=counts[k])
        self._keep.append(distributed)
      except BaseException as e:  # pylint: disable=broad-except
        errors.append(e)

    joins = [threading.Thread(target=join, args=(k,), daemon=True)
             for k in range(len(counts))]
    for t in joins:
      t.start()
    for t in joins:
      t.join(_EXCHANGE_TIMEOUT_S)
    if errors or len(clients) != len(counts):
      raise RuntimeError(f"could not build the colocated device view: "
                         f"{errors[0] if errors else 'timed out'}")
    # The service and every node stay up for the process's life: a node
    # leaving makes the others' agents abort the process.
    self._keep += [service, *clients.values()]
    return clients[node]

  def install(self) -> None:
    """Makes this JAX's 'cpu' backend the view, and maps colocated_python's
    device ids to the client's."""
    from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
    from jax.experimental.colocated_python import serialization  # pylint: disable=import-outside-toplevel
    xla_bridge.register_backend_factory("cpu", lambda: self.client,
                                        priority=1000, fail_quietly=False)
    to_client = self.client_id
    common = serialization._make_reduce_func_with_common_obj  # pylint: disable=protected-access

    def ids(devices: Any) -> np.ndarray:
      return np.vectorize(lambda d: to_client[d.id], otypes=[int])(devices)

    def reduce_mesh(mesh: Any) -> Any:
      return serialization._unreduce_mesh, (  # pylint: disable=protected-access
          ids(mesh.devices), mesh.axis_names, mesh.axis_types)

    def reduce_device_list(device_list: Any) -> Any:
      return serialization._unreduce_device_list, (  # pylint: disable=protected-access
          [to_client[d.id] for d in device_list],)

    def reduce_single_device_sharding(sharding: Any) -> Any:
      return serialization._unreduce_single_device_sharding, (  # pylint: disable=protected-access
          to_client[next(iter(sharding.device_set)).id], sharding.memory_kind)

    # pylint: disable=protected-access
    serialization._get_cpu_device_map = lambda: self.by_client_id
    serialization._reduce_mesh = common(reduce_mesh)
    serialization._reduce_device_list = common(reduce_device_list)
    serialization._reduce_single_device_sharding = common(
        reduce_single_device_sharding)
