"""Bit-for-bit comparison of pytrees, shared by the suite (conftest.py) and
the scripts it runs in subprocesses (platforms/cuda_client.py)."""
from __future__ import annotations

from typing import Any

import jax
import numpy as np


def difference(expected: Any, actual: Any) -> str | None:
  """How `actual` differs from `expected` in structure, dtypes, shapes or
  bits (NaNs included); None if it does not."""
  e_leaves, e_tree = jax.tree.flatten(expected)
  a_leaves, a_tree = jax.tree.flatten(actual)
  if e_tree != a_tree:
    return f"structure {a_tree}, expected {e_tree}"
  for i, (e, a) in enumerate(zip(e_leaves, a_leaves)):
    e, a = np.asarray(e), np.asarray(a)
    if e.dtype != a.dtype:
      return f"leaf {i}: dtype {a.dtype}, expected {e.dtype}"
    if e.shape != a.shape:
      return f"leaf {i}: shape {a.shape}, expected {e.shape}"
    if e.tobytes() != a.tobytes():
      return f"leaf {i}: values differ:\n{e}\n{a}"
  return None


def assert_same(expected: Any, actual: Any) -> None:
  """Same structure, dtypes, shapes and bits (NaNs included)."""
  differs = difference(expected, actual)
  assert differs is None, differs
