"""Island: devices joined by a fast interconnect, served by one worker.

In tests an island is one worker process with N emulated CPU devices; on real
hardware it is a TPU slice or a GPU node. Devices have global ids that the
client sees; the worker knows them by local index.
"""
from __future__ import annotations

import dataclasses
from typing import NewType

IslandId = NewType("IslandId", int)
DeviceId = NewType("DeviceId", int)


@dataclasses.dataclass
class Island:
  id: IslandId
  num_devices: int
  platform: str
  device_kind: str
  worker_pid: int
  worker_host: str
  data_address: str
  first_device: DeviceId = DeviceId(-1)  # set when the topology is complete
  memory_bytes: int = 0  # device memory of the whole island; 0: untracked
  host_memory_bytes: int = 0  # its worker host's memory; 0: not reported
  transfer_address: str = ""  # its transfer server; "": pushes only
  # 0 for the island's first worker; each worker that takes the place of a
  # lost one adds 1. Nothing of an older generation is used again.
  generation: int = 0
  # The custom call kernels its jaxlib registers (programs/custom_calls.py);
  # None: not reported, the controller's own view of the platform.
  custom_call_targets: frozenset[str] | None = None
  # Whether its PJRT client takes exported programs with their Shardy
  # annotations (jax.export asks the client: InitResponse).
  serialize_with_sdy: bool = True

  @property
  def name(self) -> str:
    """How errors and `jax-pathways status` name this island's worker."""
    return f"island {self.id} (worker pid {self.worker_pid} on {self.worker_host})"

  @property
  def most_memory(self) -> int:
    """The most memory a program on this island could use (0: unknown):
    its devices', else (CPU devices) its host's."""
    return self.memory_bytes or self.host_memory_bytes

  @property
  def device_ids(self) -> range:
    return range(self.first_device, self.first_device + self.num_devices)

  def local_index(self, device: int) -> int:
    return device - self.first_device
