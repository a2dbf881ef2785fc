"""Client-level requests: Init, default device assignment, default layout."""
from __future__ import annotations

from typing import Any

from jax_pathways.controller.handlers.handler_table import handles
from jax_pathways.controller.session import Reply, Session
from jax_pathways.status import invalid_argument


def _attribute(attrs: Any, key: str, value: Any) -> None:
  v = attrs.attributes[key]
  if isinstance(value, bool):
    v.bool_value = value
  elif isinstance(value, int):
    v.int64_value = value
  else:
    v.string_value = str(value).encode()


@handles("init_request")
def init(session: Session, req: Any, reply: Reply) -> None:
  topology = session.services.topology
  devices = session.slice  # waits for every island to join
  first = topology.island_of_device(devices.physical_ids[0])

  def fill(r: Any) -> None:
    r.session_id = session.id
    r.platform_name = first.platform or "cpu"
    r.platform_version = session.services.platform_version
    r.platform_id = 0
    r.process_index = 0  # one client drives every device
    # The client shows it as "proxy/pathways", as with Pathways on Cloud:
    # orbax then takes its Pathways paths (docs/storage.md).
    r.runtime_type = "pathways"
    # The proxy client cannot serialize executables; JAX must not try to
    # use its persistent compilation cache with them.
    _attribute(r.client_attributes, "supports_executable_serialization", False)
    # jax.export reads it before it serializes (as the islands' PJRT
    # clients say; without it every export fails in the client).
    _attribute(r.client_attributes, "serialize_with_sdy",
               all(i.serialize_with_sdy for i in topology.islands()))
    # The client sees its virtual slice: devices 0..n-1, each saying where
    # it really is.
    for device, physical in enumerate(devices.physical_ids):
      island = topology.island_of_device(physical)
      local = island.local_index(physical)
      d = r.all_devices.add()
      d.id = device
      d.local_device_id = device
      d.local_hardware_id = physical
      d.platform_name = island.platform or "cpu"
      d.device_kind = island.device_kind or "cpu"
      d.default_memory_id = device
      d.memory_ids.append(device)
      text = (f"PathwaysDevice(id={device}, island={island.id}, "
              f"local={local}, physical={physical})")
      d.debug_string = text
      d.to_string = text
      # How Pathways shows slices: device.slice_index names the island.
      _attribute(d.attributes, "slice_index", int(island.id))
      _attribute(d.attributes, "island", int(island.id))
      _attribute(d.attributes, "island_local_index", local)
      _attribute(d.attributes, "physical_device", physical)
      _attribute(d.attributes, "worker", island.name)
      # colocated_python's colocated_cpu_devices pairs each device with the
      # CPU device of the same id: the islands' devices are their own
      # (without it, JAX pairs devices with CPU devices in id order).
      _attribute(d.attributes, "colocation_id", device)
      r.primary_device_ids.append(device)
      r.addressable_device_ids.append(device)
      m = r.memories.add()
      m.id = device
      m.memory_space_kind = "device"
      m.kind_id = 0
      m.device_ids.append(device)
      m.debug_string = f"PathwaysMemory(device={device}, kind=device)"
      m.to_string = m.debug_string

  reply.ok(fill)


@handles("get_default_device_assignment_request")
def get_default_device_assignment(session: Session, req: Any,
                                  reply: Reply) -> None:
  replicas, partitions = req.num_replicas, req.num_partitions
  total = session.slice.size
  if replicas * partitions > total or replicas * partitions < 1:
    raise invalid_argument(
        f"cannot assign {replicas} replicas x {partitions} partitions to "
        f"{total} devices")

  def fill(r: Any) -> None:
    da = r.device_assignment
    da.replica_count = replicas
    da.computation_count = partitions
    for c in range(partitions):
      cd = da.computation_devices.add()
      cd.replica_device_ids.extend(r_ * partitions + c for r_ in range(replicas))

  reply.ok(fill)


@handles("get_default_layout_request")
def get_default_layout(session: Session, req: Any, reply: Reply) -> None:
  # PjRtLayout::Serialize() is the xla::Layout text form, e.g. "{1,0}":
  # row-major, which is what every CPU (and the client's default) uses.
  minor_to_major = ",".join(str(i) for i in reversed(range(len(req.dims))))
  reply.ok(lambda r: setattr(r, "serialized_pjrt_layout",
                             ("{" + minor_to_major + "}").encode()))
