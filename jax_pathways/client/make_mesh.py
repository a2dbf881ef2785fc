"""jax.make_mesh over the devices of several islands.

Every device says its island as `slice_index`, as Pathways shows slices, so
that tools grouping devices by slice (pathwaysutils' elastic Manager,
`mesh_utils.create_hybrid_device_mesh`) see the islands. JAX's make_mesh
refuses devices of several slices, because on TPU it lays out one slice's
physical torus. jax_pathways' devices have no torus: JAX lays them out in
the order given (as for one CPU host), so this make_mesh builds that mesh;
`jax.devices()` lists the islands one after another, so the islands split
the outermost axes, as in a hybrid mesh. Meshes within one island, and of
other backends, are JAX's own.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Sequence

_jax_make_mesh: Any = None  # JAX's own, once install() has run


def install() -> None:
  """Makes jax.make_mesh (and JAX's test utilities, which call it through
  its module) build meshes over several islands. Idempotent."""
  global _jax_make_mesh
  import jax  # pylint: disable=import-outside-toplevel
  from jax._src import sharding_impls  # pylint: disable=import-outside-toplevel
  if _jax_make_mesh is not None:
    return
  _jax_make_mesh = sharding_impls.make_mesh
  wrapped = functools.wraps(_jax_make_mesh)(make_mesh)
  sharding_impls.make_mesh = wrapped
  jax.make_mesh = wrapped


def make_mesh(axis_shapes: Sequence[int], axis_names: Sequence[str],
              axis_types: tuple[Any, ...] | None = None, *,
              devices: Sequence[Any] | None = None) -> Any:
  # JAX's signature; install() gives it JAX's docstring.
  import jax  # pylint: disable=import-outside-toplevel
  from jax.experimental import mesh_utils  # pylint: disable=import-outside-toplevel
  try:
    shape = tuple(int(s) for s in axis_shapes)
  except (TypeError, ValueError):
    shape = None  # JAX's make_mesh says what is wrong
  chosen = list(jax.devices() if devices is None else devices)
  if shape is None or math.prod(shape) > len(chosen):
    return _jax_make_mesh(axis_shapes, axis_names, axis_types,
                          devices=devices)
  chosen = chosen[:math.prod(shape)]  # as JAX: the first ones
  if not _spans_islands(chosen):
    return _jax_make_mesh(axis_shapes, axis_names, axis_types,
                          devices=devices)
  if axis_types is None:  # JAX's default
    axis_types = (jax.sharding.AxisType.Explicit,) * len(shape)
  return jax.sharding.Mesh(mesh_utils.create_device_mesh(shape, chosen),
                           axis_names, axis_types=axis_types)


def _spans_islands(devices: Sequence[Any]) -> bool:
  """Whether all are jax_pathways devices (they say their island) and of
  more than one island."""
  islands = {getattr(d, "island", None) for d in devices}
  return None not in islands and len(islands) > 1
