"""Shards: which piece of an array each device holds, for moving arrays
between islands.

A sender and a receiver on different islands compute the same pieces from
the same sharding spec (the island-local form the controller sends): the
sender pushes each distinct piece once (replicas are not sent twice), and the
receiver places them straight onto its devices when the destination has the
same layout, or assembles the array on the host when it does not.
"""
from __future__ import annotations

import base64
from typing import Any, Sequence

import numpy as np

from jax._src import op_shardings
from jax._src.lib import xla_client as xc

Index = tuple[tuple[int, int], ...]  # per dimension (start, stop)


def indices(spec: dict[str, Any], shape: Sequence[int]) -> list[Index]:
  """Each device's piece, in the spec's device order."""
  n = len(spec["devices"])
  if spec.get("op_sharding") is None:
    hlo = xc.HloSharding.replicate()
  else:
    op = xc.OpSharding()
    op.ParseFromString(base64.b64decode(spec["op_sharding"]))
    hlo = xc.HloSharding.from_proto(op)
  return [tuple(s.indices(d)[:2] for s, d in zip(slices, shape))
          for slices in op_shardings.op_sharding_to_indices(hlo, shape, n)]


def distinct(pieces: Sequence[Index]) -> list[int]:
  """Positions of the first device holding each distinct piece."""
  first: dict[Index, int] = {}
  for i, p in enumerate(pieces):
    first.setdefault(p, i)
  return list(first.values())


def as_slices(index: Index) -> tuple[slice, ...]:
  return tuple(slice(a, b) for a, b in index)


def assemble_on_host(shape: Sequence[int], dtype: np.dtype,
                     pieces: dict[Index, np.ndarray]) -> np.ndarray:
  out = np.empty(tuple(shape), dtype)
  for index, piece in pieces.items():
    out[as_slices(index)] = piece
  return out


def same_pieces(source: dict[str, Any], destination: dict[str, Any],
                shape: Sequence[int]) -> bool:
  """Whether each destination device takes exactly the piece of the
  source device at the same position, with no piece held twice: then the
  array can move device to device, shard by shard (worker/transfers.py)."""
  if len(source["devices"]) != len(destination["devices"]):
    return False
  pieces = indices(source, shape)
  return (pieces == indices(destination, shape) and
          len(distinct(pieces)) == len(pieces))
