"""Copies between the cluster's devices and this process's own, by the host.

JAX's CPU backend stays beside the cluster in the user's process
(`jax.devices("cpu")`), and JAX copies an array between devices with one
call into jaxlib (`batched_copy_array_to_devices_with_sharding`), which
cannot copy between two clients: the proxy client copies only between its
own devices ("CopyArrays only supports devices that are instances of
xla::ifrt::proxy::Device") and PjRt's CPU client only to PjRt clients ("the
Array must be first fetched to the host"). JAX takes that path for
`jax.device_put(array, other_clients_device)` of a key array or a sharded
one, and so for an eager `jax.debug.print` of a PRNG key (JAX puts a
callback's operands on its CPU backend). install() makes such a copy go
through the host, as the error tells the user to do; copies within one
client stay jaxlib's own. A patch of JAX's behaviour, like jax.make_mesh's
(docs/limitations.md).
"""
from __future__ import annotations

from typing import Any, Sequence

_installed = False


def install() -> None:
  """Idempotent."""
  global _installed
  if _installed:
    return
  _installed = True
  from jax._src.lib import xla_client as xc  # pylint: disable=import-outside-toplevel
  copy = xc.batched_copy_array_to_devices_with_sharding

  def copy_across_clients(arrays: Sequence[Any], device_lists: Sequence[Any],
                          shardings: Sequence[Any],
                          copy_semantics: Sequence[Any]) -> list[Any]:
    across = [i for i, (x, devices) in enumerate(zip(arrays, device_lists))
              if _client(x) is not _client_of(devices)]
    if not across:
      return copy(arrays, device_lists, shardings, copy_semantics)
    within = [i for i in range(len(arrays)) if i not in set(across)]
    out: list[Any] = [None] * len(arrays)
    if within:
      for i, y in zip(within, copy(*[[seq[i] for i in within] for seq in (
          arrays, device_lists, shardings, copy_semantics)])):
        out[i] = y
    import jax  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    for i in across:
      out[i] = jax.device_put(np.asarray(arrays[i]), shardings[i])
    return out

  xc.batched_copy_array_to_devices_with_sharding = copy_across_clients


def _client(array: Any) -> Any:
  return array.sharding._device_assignment[0].client  # pylint: disable=protected-access


def _client_of(devices: Any) -> Any:
  return next(iter(devices)).client
