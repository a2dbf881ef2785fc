"""Cluster tokens at rest: the file a controller writes and its host reads.

A controller started without JAX_PATHWAYS_TOKEN (and without --insecure)
makes a token and keeps it in a file only its user can read (0600, in a
0700 folder; ~/.jax_pathways/token unless JAX_PATHWAYS_TOKEN_FILE says
otherwise). Workers, `jax-pathways status` and clients on that host read it
from there; elsewhere the token travels as JAX_PATHWAYS_TOKEN. A file that
others can read is refused, not used.
"""
from __future__ import annotations

import os
import secrets
import stat

from jax_pathways.status import failed_precondition


def default_path() -> str:
  return os.path.join(os.path.expanduser("~"), ".jax_pathways", "token")


def load(path: str) -> str | None:
  """The token kept at `path`, or None if there is none."""
  try:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
  except FileNotFoundError:
    return None
  with os.fdopen(fd) as f:
    mode = os.fstat(f.fileno()).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
      raise failed_precondition(
          f"{path} holds a cluster token but others may read it "
          f"(mode {stat.filemode(mode)}); run chmod 600 {path} or delete it")
    return f.read().strip() or None


def new() -> str:
  """A fresh cluster token."""
  return secrets.token_hex(16)


def load_or_create(path: str) -> str:
  """The token kept at `path`; a fresh one, written there 0600, if none."""
  token = load(path)
  if token:
    return token
  os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
  token = new()
  try:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                 0o600)
  except FileExistsError:  # another controller wrote it first: share it
    return load(path) or load_or_create(path)
  with os.fdopen(fd, "w") as f:
    f.write(token + "\n")
  return token
