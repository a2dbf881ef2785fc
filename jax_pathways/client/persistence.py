"""Persistence: this process has the islands save and restore arrays, sending none of their bytes.

The same requests orbax's Pathways handler and pathwaysutils send
(storage/requests.py): a PluginProgram per group of arrays on the same
devices, executed with an execution token. The islands' workers write and
read their own shards under their storage root (docs/storage.md).
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
from jax._src.interpreters import pxla
from jax.extend import ifrt_programs

from jax_pathways.storage import requests

_programs = ifrt_programs.ifrt_programs
# What orbax's Pathways handler waits for a request at most.
TIMEOUT_S = 3600.0
# What JAX's proxy client shows for the controller (handlers/client.py).
RUNTIME_TYPE = "proxy/pathways"


def served(array: jax.Array) -> bool:
  """Whether `array`'s client is jax_pathways' (a proxy to a Pathways
  runtime), which serves persistence requests."""
  client = array.sharding._device_assignment[0].client  # pylint: disable=protected-access
  return client.runtime_type == RUNTIME_TYPE


def save(location: str, names: Sequence[str], arrays: Sequence[jax.Array],
         timeout_s: float = TIMEOUT_S) -> None:
  """Writes each array at `<location>/<name>`; returns once every shard is
  written. Raises JaxRuntimeError with the workers' error (DATA_LOSS if an
  island holding a shard was lost)."""
  for group in _groups(arrays):
    text = requests.bulk(True, location, [
        _describe(names[i], arrays[i].shape, None, arrays[i].sharding)
        for i in group], timeout_s)
    results = _compile(text, arrays[group[0]]).execute_sharded(
        [arrays[i] for i in group], with_tokens=True)
    results.consume_token().block_until_ready()


def restore(location: str, names: Sequence[str],
            targets: Sequence[jax.ShapeDtypeStruct],
            timeout_s: float = TIMEOUT_S) -> list[jax.Array]:
  """The arrays saved at `<location>/<name>`, of each target's shape and
  dtype, laid out as its sharding says (any: resharded as read)."""
  out: list[Any] = [None] * len(targets)
  for group in _groups(targets):
    text = requests.bulk(False, location, [
        _describe(names[i], targets[i].shape, targets[i].dtype.name,
                  targets[i].sharding) for i in group], timeout_s)
    results = _compile(text, targets[group[0]]).execute_sharded(
        [], with_tokens=True)
    handlers = [pxla.global_aval_to_result_handler(
        jax.core.ShapedArray(targets[i].shape, targets[i].dtype),
        targets[i].sharding, True) for i in group]
    arrays = results.consume_with_handlers(handlers)
    results.consume_token().block_until_ready()
    for i, a in zip(group, arrays):
      out[i] = a
  return out


def _groups(values: Sequence[Any]) -> list[list[int]]:
  """Indices of `values` by device assignment, in order: one execution's
  arrays span the same devices."""
  groups: dict[tuple[Any, ...], list[int]] = {}
  for i, v in enumerate(values):
    key = tuple(v.sharding._device_assignment)  # pylint: disable=protected-access
    groups.setdefault(key, []).append(i)
  return list(groups.values())


def _describe(name: str, shape: Sequence[int], dtype: str | None,
              sharding: jax.sharding.Sharding) -> dict[str, Any]:
  return {"name": name, "shape": list(shape), "dtype": dtype,
          "op_sharding": sharding._to_xla_hlo_sharding(  # pylint: disable=protected-access
              len(shape)).to_proto().SerializeToString(),
          "device_ids": [d.id for d in sharding._device_assignment]}  # pylint: disable=protected-access


def _compile(text: str, on: Any) -> Any:
  client = on.sharding._device_assignment[0].client  # pylint: disable=protected-access
  return client.compile_ifrt_program(
      _programs.make_plugin_program(text),
      _programs.make_plugin_compile_options())
