"""Validation: the rules a client's values must meet before they touch memory.

The controller applies them to every request field where it enters (the
edge); the worker applies the host-buffer rules again before it maps a
payload, because it trusts nothing that arrives on the wire. Every rule
raises INVALID_ARGUMENT naming the field, the value and the rule.
"""
from __future__ import annotations

import math
from typing import Any, Container, Iterable, Sequence

from jax_pathways.status import invalid_argument

# The largest array, in bytes, a request may describe: larger sizes are
# nonsense on any host and would overflow the int64 sizes XLA computes with.
MAX_ARRAY_BYTES = 1 << 62


def check_shape(dims: Sequence[int], itemsize: int, field: str
                ) -> tuple[int, ...]:
  """`dims` as a shape: no negative dimension, and a byte size below
  MAX_ARRAY_BYTES (checked dimension by dimension, so a product that would
  overflow never gets computed in full; a zero dimension does not excuse
  the others)."""
  shape = tuple(int(d) for d in dims)
  size = itemsize
  for d in shape:
    if d < 0:
      raise invalid_argument(f"{field}: shape {list(shape)} has a negative "
                             "dimension")
    size *= max(d, 1)
    if size > MAX_ARRAY_BYTES:
      raise invalid_argument(
          f"{field}: shape {list(shape)} of {itemsize}-byte elements is "
          f"larger than {MAX_ARRAY_BYTES} bytes")
  return shape


def _byte_span(shape: Sequence[int], itemsize: int, strides: Sequence[int],
               field: str) -> tuple[int, int]:
  """(lowest, highest + 1) byte offset the elements of a strided array
  address, relative to its first element."""
  if len(strides) != len(shape):
    raise invalid_argument(
        f"{field}: byte_strides {list(strides)} has {len(strides)} entries "
        f"for a shape of rank {len(shape)}")
  if 0 in shape:
    return 0, 0
  low = high = 0
  for d, s in zip(shape, strides):
    if s < 0:
      low += s * (d - 1)
    else:
      high += s * (d - 1)
  return low, high + itemsize


def check_host_buffer(shape: Sequence[int], itemsize: int,
                      strides: Sequence[int] | None, nbytes: int,
                      field: str) -> None:
  """A host buffer of `nbytes` holds an array of `shape`: exactly
  (row-major, no strides), or with every element `strides` address inside
  it, measured from its first byte."""
  size = math.prod(shape) * itemsize
  if strides is None:
    if size != nbytes:
      raise invalid_argument(
          f"{field}: shape {list(shape)} of {itemsize}-byte elements needs "
          f"{size} bytes but the host buffer has {nbytes}")
    return
  low, high = _byte_span(shape, itemsize, strides, field)
  if low < 0:
    raise invalid_argument(
        f"{field}: byte_strides {list(strides)} address {-low} bytes before "
        f"the start of the {nbytes}-byte host buffer")
  if high > nbytes:
    raise invalid_argument(
        f"{field}: byte_strides {list(strides)} address {high - nbytes} "
        f"bytes beyond the {nbytes}-byte host buffer")


def check_dense_strides(shape: Sequence[int], itemsize: int,
                        strides: Sequence[int] | None, field: str) -> None:
  """`strides` lay the array out densely (a permutation of its dimensions,
  row-major in that order): every byte of a buffer written through them is
  written exactly once, so no byte of it is left over from earlier use."""
  if strides is None:
    return
  _byte_span(shape, itemsize, strides, field)  # the rank
  if 0 in shape:
    return
  expected = itemsize
  for s, d in sorted((s, d) for s, d in zip(strides, shape) if d != 1):
    if s != expected:
      raise invalid_argument(
          f"{field}: byte_strides {list(strides)} do not lay out shape "
          f"{list(shape)} of {itemsize}-byte elements densely (some "
          "permutation of the dimensions, each stride the product of the "
          "smaller ones)")
    expected *= d


# Handles a client mints stay below this; the controller's start here
# (controller/handle_store.py), so the two never collide.
SERVER_HANDLES_START = 1 << 48


def check_client_handle(handle: int, kind: str) -> None:
  if not 0 < handle < SERVER_HANDLES_START:
    raise invalid_argument(
        f"{kind} handle {handle} is outside the range a client may choose "
        f"(1 to 2**48 - 1; the controller mints handles from 2**48 up)")


# Entries of one list a request may hold: work on the controller grows
# with them (a DestructArray of 16,777,216 handles held every session for
# 33 s); JAX's client sends far fewer, in batches.
MAX_LIST = 1 << 20


def check_list_sizes(body: Any, kind: str) -> None:
  """Each list of a request body (handles, shards, devices) is at most
  MAX_LIST long."""
  for field, value in body.ListFields():
    if (field.is_repeated and
        field.message_type is None and len(value) > MAX_LIST):
      raise invalid_argument(
          f"{kind}.{field.name} names {len(value)} entries, more than the "
          f"{MAX_LIST} one request may; send them in several requests")


def check_new_handles(handles: Iterable[int], existing: Container[int],
                      field: str) -> None:
  """Handles a request asks to create: distinct, and none already naming
  something (a request must never silently replace a live object)."""
  seen: set[int] = set()
  for h in handles:
    check_client_handle(h, f"{field}:")
    if h in seen:
      raise invalid_argument(f"{field}: handle {h} is named twice")
    if h in existing:
      raise invalid_argument(
          f"{field}: handle {h} already names an array of this session; "
          "result handles must be new")
    seen.add(h)


def check_device_count(count: int, available: int, field: str) -> None:
  """A program or array over `count` devices fits the client's slice."""
  if not 0 < count <= available:
    raise invalid_argument(
        f"{field}: {count} devices asked for, but this client has "
        f"{available}")


def check_distinct(ids: Sequence[int], field: str) -> None:
  if len(set(ids)) != len(ids):
    raise invalid_argument(f"{field}: device ids {list(ids)} name a device "
                           "more than once")
