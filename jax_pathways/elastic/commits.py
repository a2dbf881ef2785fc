"""Commits: the last train state known good, kept in this process's memory.

The client process is the one process a single-controller job cannot lose
(it is the job), so a copy of the state on its host survives any island.
Taking one is a download of every array; placing one is an upload onto
whatever devices the job runs on now (the same, or fewer after a loss).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class Commit:
  """The train state after `step` steps, as numpy arrays on this host."""
  step: int
  state: Any  # a pytree of numpy arrays (and whatever else it held)


def take(state: Any, step: int) -> Commit:
  """Copies `state` to host memory. Raises what reading the state raises
  (JaxRuntimeError with DATA_LOSS when an island it needs was lost): then
  nothing is committed."""
  leaves = jax.tree.leaves(state)
  # One readiness check for all first: a lost island fails it once, where
  # each download would fail (and jaxlib log a warning) on its own.
  jax.block_until_ready(leaves)
  for leaf in leaves:  # every download in flight at once, then read them
    if isinstance(leaf, jax.Array):
      leaf.copy_to_host_async()
  return Commit(step, jax.tree.map(
      lambda x: np.asarray(x) if isinstance(x, jax.Array) else x, state))


def place(commit: Commit, sharding: Any) -> Any:
  """The committed state on devices: `sharding` is a Sharding, or a pytree
  of them matching (a prefix of) the state. Waits until it is there, so
  that a loss during the upload shows here."""
  return jax.block_until_ready(jax.device_put(commit.state, sharding))
