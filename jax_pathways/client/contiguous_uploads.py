"""Uploads of strided numpy shards carry their own elements only.

JAX puts a numpy array on a sharding by slicing it per device (`x[index]`,
a view) and handing the views to jaxlib. For a view that is not contiguous
(a column shard of a row-major array), jaxlib's proxy client uploads the
whole region of memory the view spans: each of 8 column shards of an array
crossed as nearly the whole array, to the controller and on to the workers
(a 512 MiB array sharded by columns over 8 devices took 14 s to put,
against 2 s by rows; one of 2 GiB took the controller past 17 GiB of
memory, until the kernel killed it). Here a strided view goes as a
contiguous copy of its own elements instead: one copy of 1/n of the array
in this process, what the bytes cost anyway on their way to the devices.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np


def install() -> None:
  """Wraps JAX's batched_device_put (once; listed with the other patches
  in docs/limitations.md)."""
  from jax._src.interpreters import pxla  # pylint: disable=import-outside-toplevel
  put = pxla.batched_device_put
  if getattr(put, "_jax_pathways", False):
    return

  @functools.wraps(put)
  def contiguous_put(aval: Any, sharding: Any, xs: Sequence[Any],
                     devices: Sequence[Any], *args: Any, **kwargs: Any
                     ) -> Any:
    if devices and _proxy(devices[0]):
      xs = [np.ascontiguousarray(x) if _strided(x) else x for x in xs]
    return put(aval, sharding, xs, devices, *args, **kwargs)

  contiguous_put._jax_pathways = True  # type: ignore[attr-defined]
  pxla.batched_device_put = contiguous_put


def _proxy(device: Any) -> bool:
  return getattr(device.client, "runtime_type", "").startswith("proxy")


def _strided(x: Any) -> bool:
  return isinstance(x, np.ndarray) and not x.flags.c_contiguous
