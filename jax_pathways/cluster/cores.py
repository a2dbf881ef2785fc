"""Cores: which CPU cores an island's devices compute on.

On CPU an island's devices are its worker's XLA threads. Pinned to cores of
their own, islands compute side by side instead of in each other's time
slices; the worker's other threads (op loop, completions, transfers) stay
free to run on any core, so a hop between islands wakes on whichever core
is idle instead of preempting a computing one. XLA sizes its thread pools
to the cores a thread may use when its client is made, so the client is made
while pinned (`pinned`), and the threads made afterwards are not.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Sequence


def parse(spec: str) -> list[int]:
  """'0,2,4-7' -> [0, 2, 4, 5, 6, 7] (taskset's list form)."""
  cores: set[int] = set()
  for part in spec.split(","):
    lo, dash, hi = part.strip().partition("-")
    try:
      first, last = int(lo), int(hi if dash else lo)
    except ValueError:
      raise ValueError(f"cores {spec!r}: expected a list like 0,2,4-7"
                       ) from None
    if first < 0 or last < first:
      raise ValueError(f"cores {spec!r}: {part!r} is not a core or a range "
                       "of cores")
    cores.update(range(first, last + 1))
  return sorted(cores)


def format_list(cores: Sequence[int]) -> str:
  return ",".join(str(c) for c in sorted(cores))


def available() -> list[int]:
  """The cores this process may run on."""
  return sorted(os.sched_getaffinity(0))


def deal(islands: int, cores: Sequence[int]) -> list[list[int]]:
  """Each island's cores: an equal share of `cores`, in order; with fewer
  cores than islands, one core each, round robin (islands then share)."""
  if not cores:
    raise ValueError("no cores to deal")
  per = max(1, len(cores) // islands)
  if islands * per > len(cores):
    return [[cores[i % len(cores)]] for i in range(islands)]
  return [list(cores[i * per:(i + 1) * per]) for i in range(islands)]


@contextlib.contextmanager
def pinned(cores: Sequence[int] | None) -> Iterator[None]:
  """Runs the block on `cores` only (None: unchanged); threads started in it
  keep them, the calling thread gets its cores back afterwards."""
  if not cores:
    yield
    return
  before = os.sched_getaffinity(0)
  missing = sorted(set(cores) - before)
  if missing:
    raise ValueError(f"cores {format_list(missing)} are not available to "
                     f"this process (it may use {format_list(before)})")
  os.sched_setaffinity(0, set(cores))
  try:
    yield
  finally:
    os.sched_setaffinity(0, before)
