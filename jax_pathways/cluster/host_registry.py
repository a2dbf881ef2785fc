"""The clusters of this host, so that `jax-pathways status` finds them
without --address.

Each controller (embedded, CLI or a Ray actor on this host) and each
`jax-pathways connect` writes an entry while it serves: a file
`<kind>-<pid>.json` holding {"kind", "address", "token", "pid", "log_dir"}
in a folder only its user may enter (it holds tokens: 0600 files in a 0700
folder, as tokens.py keeps the token file), removed when it stops. An
entry whose process is gone (killed) is skipped and removed by the next
reader.
"""
from __future__ import annotations

import contextlib
import json
import os
import stat

from absl import logging

from jax_pathways.cluster import addresses


def folder() -> str:
  """$XDG_RUNTIME_DIR/jax_pathways (a tmpfs of this user's, emptied at
  logout), else ~/.jax_pathways/clusters."""
  runtime = os.environ.get("XDG_RUNTIME_DIR")
  if runtime and os.path.isdir(runtime):
    return os.path.join(runtime, "jax_pathways")
  return os.path.join(os.path.expanduser("~"), ".jax_pathways", "clusters")


def add(kind: str, address: str, token: str | None,
        log_dir: str | None = None) -> str | None:
  """Registers this process's `kind` ("controller", "connect") at
  `address`; returns the entry's path (None if it could not be written:
  status then needs --address, nothing else changes)."""
  where = folder()
  path = os.path.join(where, f"{kind}-{os.getpid()}.json")
  try:
    os.makedirs(where, mode=0o700, exist_ok=True)
    if os.stat(where).st_mode & (stat.S_IRWXG | stat.S_IRWXO):
      raise PermissionError(f"{where} is open to other users")
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC |
                 os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
      json.dump({"kind": kind, "address": addresses.grpc_url(address),
                 "token": token, "pid": os.getpid(), "log_dir": log_dir}, f)
    os.replace(path + ".tmp", path)
  except OSError as e:
    logging.info("jax_pathways: not listed for `jax-pathways status` (%s)",
                 e)
    return None
  return path


def remove(path: str | None) -> None:
  if path is not None:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(path)


def live() -> list[dict]:
  """The entries whose process runs, oldest first."""
  where = folder()
  try:
    names = os.listdir(where)
  except OSError:
    return []
  entries = []
  for name in names:
    if not name.endswith(".json"):
      continue
    path = os.path.join(where, name)
    try:
      with open(path) as f:
        entry = json.load(f)
        entry["since"] = os.fstat(f.fileno()).st_mtime
      pid = int(entry["pid"])
    except (OSError, ValueError, KeyError, TypeError):
      continue  # gone meanwhile, or not an entry
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      remove(path)  # killed before it could remove its entry
      continue
    except PermissionError:
      pass  # alive, another user's (not in this folder normally)
    entries.append(entry)
  return sorted(entries, key=lambda e: e["since"])
