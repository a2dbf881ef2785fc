"""Big host buffers of a client come back from its heap, transfer after
transfer, instead of fresh from the kernel each time.

glibc serves every allocation past its mmap threshold (at most 32 MiB) with
an mmap of its own and unmaps it on free, and gives back the top of its
heap past 128 KiB, so each `np.asarray` of a big array takes all its memory
fresh: jaxlib's proxy client flattens each shard's bytes into a new buffer,
JAX makes a new NumPy array per shard and one for the result (NumPy asks
for huge pages). What fresh pages cost depends on the machine: on a VM that
hands freed memory back to its host (this project's test machine:
virtio-balloon free page reporting), a 512 MiB get faulted the same ~150k
small and ~470 huge pages every time, in 0.5 s of kernel time or in 3.4 s,
unpredictably. With mmap of big blocks off (M_MMAP_MAX 0, what
GLIBC_TUNABLES=glibc.malloc.mmap_max=0 does) and the heap's free top kept
(M_TRIM_THRESHOLD), they come from the heap and the next transfer reuses
them: repeated 512 MiB gets took 0.52-0.98 s, against 0.57-3.2 s
(docs/benchmarks.md, "Big transfers"). What is kept is bounded: past
JAX_PATHWAYS_CLIENT_HEAP_KEEP_MB of free heap, heap_trim's thread gives
it all back (checked every 2 s), so what one outsized transfer freed does
not stay with the process. 0 keeps glibc's default.
"""
from __future__ import annotations

from absl import logging

from jax_pathways import heap_trim

# mallopt's parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_INT_MAX = (1 << 31) - 1

_installed = False


def install(keep_mb: int) -> None:
  """Makes this process's big blocks come from its heap and keeps up to
  `keep_mb` MiB of them free (once; nothing for 0, or where heap_trim
  cannot bound what is kept: not glibc 2.33+)."""
  global _installed  # pylint: disable=global-statement
  if _installed or not keep_mb:
    return
  _installed = True
  libc = heap_trim.libc()
  if libc is None:
    logging.info("not glibc 2.33+: big host buffers stay with the "
                 "allocator's default")
    return
  keep = keep_mb << 20
  if (libc.mallopt(_M_TRIM_THRESHOLD, min(keep, _INT_MAX)) != 1
      or libc.mallopt(_M_MMAP_MAX, 0) != 1):
    logging.warning("glibc refused mallopt: big transfers take fresh memory "
                    "each time")
    return
  heap_trim.start(keep)
