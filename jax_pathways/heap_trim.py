"""Giving freed heap memory back to the system, in the controller's and the
workers' processes (and a client's, past its own bound: client/heap_reuse.py).

glibc keeps what a process frees in its arenas, for the next allocation of
the thread that freed it; it returns little of it by itself (only the top
of each arena). After a one-off big transfer (a checkpoint's restore, a
state's first upload), the pieces gRPC and the transports allocated are
free but stay resident: a controller that had carried a 1 GiB round trip
held 0.6 GiB of free arena memory afterwards, and at 2 GiB the test
machine's processes ran out of memory together. A thread here looks at the
arenas' free bytes (mallinfo2) every CHECK_EVERY_S and, past the bound,
gives them back (malloc_trim, with the GIL released: ctypes). A process
whose free memory stays under the bound is never trimmed; the buffers the
transports reuse on purpose are in common/bytes.cc's pool, which this does
not touch.
"""
from __future__ import annotations

import ctypes
import os
import time

from absl import logging

from jax_pathways import config
from jax_pathways import threads

# Free arena bytes a process keeps (JAX_PATHWAYS_HEAP_KEEP_MB overrides).
KEEP_MB = 256
CHECK_EVERY_S = 2.0


class _MallInfo2(ctypes.Structure):
  _fields_ = [(name, ctypes.c_size_t) for name in (
      "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
      "uordblks", "fordblks", "keepcost")]


def libc() -> ctypes.CDLL | None:
  """The process's libc if it is glibc 2.33 or newer (mallinfo2), with the
  malloc calls this package makes typed."""
  lib = ctypes.CDLL(None)
  if not all(hasattr(lib, f) for f in ("mallinfo2", "malloc_trim",
                                       "mallopt")):
    return None
  lib.mallinfo2.restype = _MallInfo2
  lib.malloc_trim.argtypes = [ctypes.c_size_t]
  lib.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
  return lib


def _keep_bytes() -> int:
  value = os.environ.get(config.HEAP_KEEP_MB, "")
  try:
    return max(0, int(value) if value else KEEP_MB) << 20
  except ValueError:
    logging.warning("%s=%r is not a number of MiB; keeping %d MiB",
                    config.HEAP_KEEP_MB, value, KEEP_MB)
    return KEEP_MB << 20


_started = False


def start(keep: int | None = None) -> None:
  """Starts the thread, once per process (nothing without glibc); it trims
  past `keep` bytes free (None: JAX_PATHWAYS_HEAP_KEEP_MB's)."""
  global _started  # pylint: disable=global-statement
  if _started:
    return
  _started = True
  lib = libc()
  if lib is None:
    logging.info("not glibc 2.33+: freed heap memory stays with the "
                 "allocator")
    return
  threads.start(_run, "jp-heap-trim", lib,
                _keep_bytes() if keep is None else keep)


def _run(libc: ctypes.CDLL, keep: int) -> None:
  while True:
    time.sleep(CHECK_EVERY_S)
    free = libc.mallinfo2().fordblks
    if free > keep:
      libc.malloc_trim(0)
      logging.vlog(1, "gave back freed heap memory: %d MiB were free",
                   free >> 20)
