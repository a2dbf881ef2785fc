"""CompilationCache: compiled programs kept on disk across workers' lives.

JAX's own persistent cache cannot work through the proxy client (it cannot
serialize executables), so the workers keep one: a worker that takes a
lost worker's place, or the next run of the same job, loads a program it
compiled before instead of compiling it again (XLA:CPU, a small MLP's
step: ~80 ms to compile, ~3 ms to load). The embedded cluster uses it under
JAX's `jax_compilation_cache_dir` when that is set;
`jax-pathways worker --compilation-cache-dir` elsewhere.

An entry is executable code: the directory must be this user's alone
(created 0700; one others may write to is refused, the cache then off),
and an entry is loaded only whole (its digest checked) and only under its
own key by the versions that wrote it: its checksummed content names its
key and the jax_pathways, jax and jaxlib versions, so an entry renamed,
swapped or copied from elsewhere is ignored (and replaced) rather than run
for another program. Entries are keyed by everything that shapes the
compiled code: the program, its options and devices, those versions, the
platform and the host's CPU (XLA:CPU compiles for the CPU it runs on). A writer killed mid-entry leaves a temporary
file, removed by the next worker after an hour. Nothing is evicted (JAX's
cache keeps everything by default too); delete the directory to empty it.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import struct
import tempfile
import time
from typing import Sequence

from absl import logging
import jax
import jaxlib

import jax_pathways

_MAGIC = b"JPXC2"
_DIGEST = 32  # sha256
_TMP = ".tmp-"  # an entry being written
# A write unfinished for this long was abandoned (its writer killed).
_ABANDONED_AFTER_S = 3600.0


def _host_cpu() -> bytes:
  """What XLA:CPU compiles for: the host's CPU model and features."""
  try:
    with open("/proc/cpuinfo", "rb") as f:
      lines = f.read().splitlines()
  except OSError:
    return b"unknown"
  wanted = (b"model name", b"flags", b"Features", b"CPU part")
  return b"\n".join(sorted({l for l in lines if l.startswith(wanted)}))


def versions() -> bytes:
  """The versions whose entries this process may load."""
  return (f"jax_pathways {jax_pathways.__version__}; jax {jax.__version__}; "
          f"jaxlib {jaxlib.__version__}").encode()


class CompilationCache:
  """Compiled programs under `directory`, by key; `stamp` names the
  versions that write and may load its entries."""

  def __init__(self, directory: str, stamp: bytes | None = None):
    self.stamp = versions() if stamp is None else stamp
    self.directory = os.path.abspath(directory)
    os.makedirs(self.directory, mode=0o700, exist_ok=True)
    st = os.stat(self.directory)
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
      raise PermissionError(
          f"compilation cache {self.directory}: owned by uid {st.st_uid} "
          f"with mode {st.st_mode & 0o777:o}; it must be this user's "
          f"(uid {os.getuid()}) and writable by no one else, since what it "
          "holds is executed")
    self._host = hashlib.sha256(_host_cpu()).digest()
    self._drop_abandoned_writes()

  def _drop_abandoned_writes(self) -> None:
    """Removes what writers killed mid-put() left; not a live writer's
    (another worker's on this host may be writing now)."""
    cutoff = time.time() - _ABANDONED_AFTER_S
    for path in glob.glob(os.path.join(self.directory, _TMP + "*")):
      with contextlib.suppress(OSError):  # its writer finished meanwhile
        if os.stat(path).st_mtime < cutoff:
          os.unlink(path)

  def key(self, *parts: bytes) -> str:
    """The key of a program compiled on this host from `parts`: its bytes,
    options, devices, compiler version, whatever else shapes it."""
    h = hashlib.sha256(self._host)
    for part in (self.stamp, *parts):
      h.update(struct.pack("<Q", len(part)))
      h.update(part)
    return h.hexdigest()

  def get(self, key: str) -> list[bytes] | None:
    """The blobs stored under `key`, or None (absent, or not whole: then
    dropped)."""
    path = os.path.join(self.directory, key)
    try:
      with open(path, "rb") as f:
        data = f.read()
    except FileNotFoundError:
      return None
    except OSError as e:
      logging.warning("compilation cache: cannot read %s: %s", path, e)
      return None
    try:
      return _decode(data, key.encode(), self.stamp)
    except ValueError as e:
      logging.warning("compilation cache: %s %s; dropped (compiling)", path,
                      e)
      self.drop(key)
      return None

  def put(self, key: str, blobs: Sequence[bytes]) -> None:
    """Stores `blobs` under `key`, whole or not at all (a full disk only
    loses the entry)."""
    try:
      fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=_TMP)
      try:
        with os.fdopen(fd, "wb") as f:
          f.write(_encode(blobs, key.encode(), self.stamp))
        os.replace(tmp, os.path.join(self.directory, key))
      except BaseException:
        os.unlink(tmp)
        raise
    except OSError as e:
      logging.warning("compilation cache: cannot store %s: %s", key, e)

  def drop(self, key: str) -> None:
    with contextlib.suppress(OSError):
      os.unlink(os.path.join(self.directory, key))


def _encode(blobs: Sequence[bytes], key: bytes, stamp: bytes) -> bytes:
  body = _MAGIC + b"".join(
      struct.pack("<Q", len(b)) + b for b in (key, stamp, *blobs))
  return body + hashlib.sha256(body).digest()


def _decode(data: bytes, key: bytes, stamp: bytes) -> list[bytes]:
  """The blobs of an entry written under `key` by `stamp`'s versions;
  ValueError (saying why) for anything else."""
  body, digest = data[:-_DIGEST], data[-_DIGEST:]
  if (len(data) < len(_MAGIC) + _DIGEST or not body.startswith(_MAGIC) or
      hashlib.sha256(body).digest() != digest):
    raise ValueError("is damaged or of another format")
  parts, at = [], len(_MAGIC)
  while at < len(body):
    if at + 8 > len(body):
      raise ValueError("is damaged")
    (size,), at = struct.unpack_from("<Q", body, at), at + 8
    if at + size > len(body):
      raise ValueError("is damaged")
    parts.append(body[at:at + size])
    at += size
  if len(parts) < 3:
    raise ValueError("is damaged")
  if parts[0] != key:
    raise ValueError("holds the entry of another program (renamed, swapped "
                     "or copied in)")
  if parts[1] != stamp:
    raise ValueError(f"was written by {parts[1].decode(errors='replace')!r}, "
                     f"not this worker's {stamp.decode()!r}")
  return parts[2:]
