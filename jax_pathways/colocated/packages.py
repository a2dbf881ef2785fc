"""The packages a colocated function needs alike on both ends.

A function cloudpickled by one jax (or Python) and unpickled by another
fails in ways that name neither; the client says what it runs
(client/plugin.py sends `describe()` with its session), and a colocated
process running something else refuses the call naming both.
"""
from __future__ import annotations

import importlib.metadata
import platform

# What a pickled function and the arrays it is handed depend on.
_PACKAGES = ("jax", "jaxlib", "cloudpickle", "numpy")


def describe() -> str:
  """This process's versions, e.g. 'python=3.11.2 jax=0.10.2 ...'."""
  parts = [f"python={'.'.join(platform.python_version_tuple()[:2])}"]
  for name in _PACKAGES:
    try:
      parts.append(f"{name}={importlib.metadata.version(name)}")
    except importlib.metadata.PackageNotFoundError:
      parts.append(f"{name}=none")
  return " ".join(parts)


def mismatch(client: str | None, ours: str) -> str | None:
  """Why a client running `client` may not call a process running `ours`
  (None: they match, or the client did not say)."""
  if not client or client == ours:
    return None
  theirs = dict(p.split("=", 1) for p in client.split() if "=" in p)
  mine = dict(p.split("=", 1) for p in ours.split() if "=" in p)
  differ = [f"{k} {theirs.get(k, '?')} (client) vs {mine.get(k, '?')} "
            f"(colocated process)" for k in sorted(set(theirs) | set(mine))
            if theirs.get(k) != mine.get(k)]
  if not differ:
    return None
  return ("the colocated process's packages are not the client's: " +
          "; ".join(differ) + ". Install the client's versions on the "
          "workers' hosts (docs/colocated_python.md)")
