"""Payloads of worker ops the controller builds in more than one place: its
Python handlers, and constants handed to the C++ fast path once
(csrc/controller/fast_path/fast_path.h). Their formats are the worker's
(worker/worker.py)."""
from __future__ import annotations

from jax_pathways.wire import payloads


def fetch(strides: list[int] | None) -> bytes:
  """A FETCH of an array's bytes in `strides` order (None: row-major)."""
  return payloads.encode({"strides": strides})


def shards(positions: list[int]) -> bytes:
  """A COPY making arrays of the source's local shards at `positions`,
  sharing its memory."""
  return payloads.encode({"mode": "shards", "positions": positions})
