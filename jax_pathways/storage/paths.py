"""Paths: where a request may put bytes, confined to the storage root.

A persistence request names `<location>/<name>` and a worker writes there:
anything a client names is hostile. The controller checks a path's form
(join); each worker, before it opens anything, checks it against the
storage root its owner gave it (confine), resolving symlinks, so neither a
`..`, an absolute path elsewhere nor a link planted under the root gets
outside it. A root may be a directory, or a gs:// or s3:// prefix read and
written through tensorstore's drivers (credentials as those drivers find
them on the workers' hosts).
"""
from __future__ import annotations

import os
from typing import Any

from jax_pathways.status import Code, StatusError, brief, invalid_argument

MAX_PATH = 4096
URL_SCHEMES = ("gs://", "s3://")


def join(location: str, name: str, what: str) -> str:
  """`<location>/<name>`, if it has the form of a path a root can hold: an
  absolute path or a gs:// or s3:// URL, with no NUL, `.` or `..` part."""
  if not name or name.startswith("/"):
    raise invalid_argument(f"{what}: name {brief(name)} must be a relative "
                           "path")
  path = location.rstrip("/") + "/" + name
  check(path, what)
  return path


def check(path: str, what: str) -> None:
  """Raises unless `path` is an absolute path or a gs:// or s3:// URL with
  no NUL, `.` or `..` part."""
  url = path.startswith(URL_SCHEMES)
  if not (url or path.startswith("/")):
    raise invalid_argument(f"{what}: {brief(path)} is neither an absolute "
                           f"path nor a {' or '.join(URL_SCHEMES)} URL")
  rest = path.split("://", 1)[1] if url else path
  if ("\0" in path or len(path) > MAX_PATH or
      any(part in (".", "..") for part in rest.split("/"))):
    raise invalid_argument(f"{what}: {brief(path)} is not a plain path (at "
                           f"most {MAX_PATH} characters, no NUL, no '.' or "
                           "'..' part)")


def confine(root: str | None, path: str) -> Any:
  """The tensorstore kvstore of `path` (a join()ed path), which must lie
  under `root`; PERMISSION_DENIED if it does not or there is no root."""
  if not root:
    raise StatusError(Code.FAILED_PRECONDITION,
                      f"cannot store {path!r}: this worker has no storage "
                      "root (start it with --storage-root DIR or "
                      "$JAX_PATHWAYS_STORAGE_ROOT)")
  check(path, "stored path")  # again: a worker trusts no one's checks
  if root.startswith(URL_SCHEMES):
    prefix = root.rstrip("/") + "/"
    if not path.startswith(prefix):
      raise _outside(path, root)
    return path
  if path.startswith(URL_SCHEMES):
    raise _outside(path, root)
  real_root = os.path.realpath(root)
  real = os.path.realpath(path)  # through every symlink that exists now
  if real != real_root and not real.startswith(
      real_root.rstrip(os.sep) + os.sep):
    raise _outside(path if real == path else f"{path} (-> {real})", root)
  return {"driver": "file", "path": real}


def _outside(path: str, root: str) -> StatusError:
  return StatusError(Code.PERMISSION_DENIED,
                     f"{path!r} is outside the storage root {root!r} the "
                     "cluster's owner set; save and restore under it")
