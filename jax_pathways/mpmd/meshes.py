"""Topology: the named meshes a pipeline runs on, and which stage goes where.

    topology = mpmd.Topology.islands()            # one mesh per island
    topology = mpmd.Topology({"front": Mesh(...), "back": Mesh(...)})

Meshes are ordinary `jax.sharding.Mesh`es of the cluster's devices; they
must not share devices. A stage is assigned to a mesh by name, or to an
island by number (its mesh from `Topology.islands()`).
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def island_of(device: Any) -> int:
  """The island (slice) of a device; 0 on backends without islands."""
  return int(getattr(device, "slice_index", 0) or 0)


class Topology:
  """Named meshes without shared devices."""

  def __init__(self, meshes: Mapping[str, Mesh]):
    if not meshes:
      raise ValueError("a topology needs at least one mesh")
    owner: dict[int, str] = {}
    for name, mesh in meshes.items():
      if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"mesh name {name!r} must be an identifier")
      if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh {name!r} must be a jax.sharding.Mesh, not "
                        f"{type(mesh).__name__}")
      for device in mesh.devices.flat:
        if device.id in owner:
          raise ValueError(
              f"meshes {owner[device.id]!r} and {name!r} overlap: both "
              f"hold device {device.id}; every device belongs to one mesh")
        owner[device.id] = name
    self.meshes: dict[str, Mesh] = dict(meshes)

  @classmethod
  def islands(cls, islands: Sequence[int] | None = None,
              devices_per_mesh: int | None = None, axis: str = "data",
              devices: Sequence[Any] | None = None) -> "Topology":
    """One mesh per island, named "island<i>", over its first
    `devices_per_mesh` devices (all by default), with one axis."""
    devices = list(devices if devices is not None else jax.devices())
    by_island: dict[int, list[Any]] = {}
    for d in devices:
      by_island.setdefault(island_of(d), []).append(d)
    wanted = list(islands) if islands is not None else sorted(by_island)
    meshes = {}
    for i in wanted:
      if i not in by_island:
        raise ValueError(
            f"island {i} does not exist; the cluster has islands "
            f"{sorted(by_island)}")
      own = by_island[i]
      n = devices_per_mesh or len(own)
      if n > len(own):
        raise ValueError(
            f"a mesh of {n} devices does not fit island {i}, which has "
            f"{len(own)} devices")
      meshes[f"island{i}"] = Mesh(np.array(own[:n]), (axis,))
    return cls(meshes)

  @property
  def names(self) -> list[str]:
    return list(self.meshes)

  def mesh_of(self, stage: str, target: str | int) -> str:
    """The mesh name a stage assignment means (a name, or an island)."""
    if isinstance(target, (int, np.integer)) and not isinstance(target, bool):
      name = f"island{int(target)}"
      if name not in self.meshes:
        islands = sorted(int(n[6:]) for n in self.meshes
                         if n.startswith("island") and n[6:].isdigit())
        raise ValueError(
            f"stage {stage!r} is assigned to island {int(target)}, which "
            f"does not exist in this topology (islands {islands})")
      return name
    if target not in self.meshes:
      raise ValueError(f"stage {stage!r} is assigned to mesh {target!r}; the "
                       f"topology has meshes {self.names}")
    return str(target)

  def shape(self) -> list[tuple[str, list[tuple[str, int]]]]:
    """[(mesh, [(axis, size), ...])], as the partitioner takes it."""
    return [(name, [(a, int(s)) for a, s in mesh.shape.items()])
            for name, mesh in self.meshes.items()]

  def devices(self) -> list[Any]:
    return [d for mesh in self.meshes.values() for d in mesh.devices.flat]

  def __repr__(self) -> str:
    parts = [f"{n}: {dict(m.shape)} devices {[d.id for d in m.devices.flat]}"
             for n, m in self.meshes.items()]
    return f"Topology({'; '.join(parts)})"
