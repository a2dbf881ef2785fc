"""The train-state-like values persistence_test.py and plain_orbax.py save."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P


def values() -> dict[str, np.ndarray]:
  rng = np.random.default_rng(7)
  return {"w": rng.normal(size=(16, 8)).astype(np.float32),
          "e": rng.normal(size=(8, 4)).astype(jnp.bfloat16),
          "b": rng.normal(size=(8,)).astype(np.float32),
          "step": np.array(12, np.int32)}


def spec_of(value: np.ndarray, layout: str) -> P:
  """How a leaf is sharded when saved, and the other way it is restored."""
  if np.ndim(value) == 2:
    return P("data", "model") if layout == "saved" else P("model", "data")
  if np.ndim(value) == 1:
    return P("model") if layout == "saved" else P()
  return P()
