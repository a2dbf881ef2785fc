"""Commits: the last train state known good, kept where no lost island takes it.

With a commit directory (Slots), a commit is a save through the islands'
workers (client/persistence.py): each writes its own shards to storage, so
a commit costs this process nothing and the state may exceed its memory;
placing one is a restore onto whatever devices the job runs on now (the
same, or fewer after a loss), resharded as read. Two slots alternate, so
the commit being written never overwrites the last good one. Without one,
the state is copied into this process's memory (the client process is the
one process a single-controller job cannot lose): a download of every
array, and an upload to place it.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from jax_pathways.client import persistence


@dataclasses.dataclass(frozen=True)
class Stored:
  """A leaf of a commit that lives in storage (not a pytree: a leaf)."""
  name: str
  shape: tuple[int, ...]
  dtype: Any
  key_impl: Any = None  # a typed PRNG key's impl: its key data is stored


@dataclasses.dataclass(frozen=True)
class Commit:
  """The train state after `step` steps: its leaves as numpy arrays on this
  host, or Stored ones under `location`."""
  step: int
  state: Any
  location: str | None = None


class Slots:
  """Where commits go in storage: two directories under `directory` (one
  the workers' storage root holds), taken in turn once a commit succeeds."""

  def __init__(self, directory: str):
    self._paths = [f"{directory.rstrip('/')}/commit_{k}" for k in (0, 1)]
    self._next = 0

  def next(self) -> str:
    return self._paths[self._next]

  def done(self) -> None:
    self._next ^= 1


def take(state: Any, step: int, slots: Slots | None = None) -> Commit:
  """Commits `state`. Raises what reading the state raises (JaxRuntimeError
  with DATA_LOSS when an island it needs was lost): then nothing is
  committed."""
  leaves, tree = jax.tree.flatten(state)
  # One readiness check for all first: a lost island fails it once, where
  # each read would fail (and jaxlib log a warning) on its own.
  jax.block_until_ready(leaves)
  arrays = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)]
  if slots is None or not arrays or not all(
      persistence.served(leaves[i]) for i in arrays):
    for i in arrays:  # every download in flight at once, then read them
      leaves[i].copy_to_host_async()
    return Commit(step, jax.tree.unflatten(tree, [
        np.asarray(x) if isinstance(x, jax.Array) else x for x in leaves]))
  location = slots.next()
  kept = list(leaves)
  saved = []
  for i in arrays:
    leaf, impl = leaves[i], None
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      impl, leaf = jax.random.key_impl(leaf), jax.random.key_data(leaf)
    # Named by its layout too: a slot written again after the mesh changed
    # gets arrays of other chunks, which must not mix with the old ones.
    chunk = "x".join(map(str, leaf.sharding.shard_shape(leaf.shape)))
    kept[i] = Stored(f"{i}-{chunk}", leaf.shape, leaf.dtype, impl)
    saved.append(leaf)
  persistence.save(location, [kept[i].name for i in arrays], saved)
  slots.done()
  return Commit(step, jax.tree.unflatten(tree, kept), location)


def place(commit: Commit, sharding: Any) -> Any:
  """The committed state on devices: `sharding` is a Sharding, or a pytree
  of them matching (a prefix of) the state. Waits until it is there, so
  that a loss meanwhile shows here."""
  if commit.location is None:
    return jax.block_until_ready(jax.device_put(commit.state, sharding))
  leaves, tree = jax.tree.flatten(commit.state)
  shardings = jax.tree.leaves(jax.tree.map(
      lambda s, sub: jax.tree.map(lambda _: s, sub), sharding, commit.state,
      is_leaf=lambda x: isinstance(x, jax.sharding.Sharding)))
  stored = [i for i, x in enumerate(leaves) if isinstance(x, Stored)]
  targets = []
  for i in stored:
    leaf, s = leaves[i], shardings[i]
    if leaf.key_impl is not None:  # the key data's trailing dimensions
      if not isinstance(s, jax.sharding.NamedSharding):
        raise ValueError(f"a PRNG key of the state is placed by {s}: give "
                         "it a NamedSharding")
      s = jax.sharding.NamedSharding(s.mesh, jax.sharding.PartitionSpec(
          *s.spec, *[None] * (len(leaf.shape) - len(s.spec))))
    targets.append(jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s))
  restored = persistence.restore(commit.location,
                                 [leaves[i].name for i in stored], targets)
  placed = list(leaves)
  for i, array in zip(stored, restored):
    impl = leaves[i].key_impl
    placed[i] = array if impl is None else jax.random.wrap_key_data(
        array, impl=impl)
  others = [i for i in range(len(leaves)) if i not in set(stored)]
  if others:
    for i, array in zip(others, jax.device_put(
        [leaves[i] for i in others], [shardings[i] for i in others])):
      placed[i] = array
  return jax.block_until_ready(jax.tree.unflatten(tree, placed))
