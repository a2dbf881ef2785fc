"""A client's big host buffers come from its heap (reused transfer after
transfer), not from an mmap of their own each (fresh pages each time)."""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

from jax_pathways import heap_trim

BIG = 48 << 20  # past glibc's largest mmap threshold (32 MiB)

# Bytes of mmapped blocks glibc adds for one big allocation in a process
# that joined (or would join) with this environment.
ONE_BIG_BLOCK = f"""
import ctypes, numpy as np
from jax_pathways import config, heap_trim
from jax_pathways.client import heap_reuse
heap_reuse.install(config.from_env().client_heap_keep_mb)
libc = heap_trim.libc()
before = libc.mallinfo2().hblkhd
block = np.ones({BIG}, np.uint8)
print(libc.mallinfo2().hblkhd - before)
"""


def _mmapped_by_one_big_block(env: dict[str, str]) -> int:
  out = subprocess.run([sys.executable, "-c", ONE_BIG_BLOCK],
                       env={**os.environ, **env}, capture_output=True,
                       text=True, timeout=120, check=True)
  return int(out.stdout.split()[-1])


@pytest.fixture(scope="module")
def libc() -> ctypes.CDLL:
  libc = heap_trim.libc()
  if libc is None:
    pytest.skip("not glibc 2.33+")
  return libc


def test_a_joined_client_takes_big_blocks_from_its_heap(libc, proxy_devices):
  import jax  # pylint: disable=import-outside-toplevel
  x = jax.device_put(np.arange(BIG // 4, dtype=np.float32),
                     proxy_devices[0])
  mmapped = libc.mallinfo2().hblkhd
  back = np.asarray(x)  # jaxlib's shard buffer and JAX's NumPy result
  block = np.ones(BIG, np.uint8)
  assert libc.mallinfo2().hblkhd <= mmapped, "a big block was mmapped"
  np.testing.assert_array_equal(back, np.arange(BIG // 4, dtype=np.float32))
  del block


@pytest.mark.parametrize("value, mmapped", [("", 0), ("64", 0), ("0", BIG)])
def test_the_default_reuses_and_0_keeps_glibcs(libc, value, mmapped):
  got = _mmapped_by_one_big_block({"JAX_PATHWAYS_CLIENT_HEAP_KEEP_MB": value})
  # glibc rounds an mmapped block up to whole pages, plus its header.
  assert mmapped <= got < mmapped + (1 << 16)


# A process that kept more free heap than its bound: the heap_trim thread
# gives it back (its resident MiB, until under the bound or 60 s).
PAST_THE_BOUND = """
import time, numpy as np
from jax_pathways.client import heap_reuse
heap_reuse.install(64)
blocks = [np.ones(64 << 20, np.uint8) for _ in range(4)]
keep_top = np.ones(1 << 20, np.uint8)  # the blocks are not the heap's top
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20
freed_at = rss()
del blocks
deadline = time.monotonic() + 60
while rss() > freed_at - 192 and time.monotonic() < deadline:
  time.sleep(0.2)
print(freed_at, rss())
"""


def test_free_heap_past_the_bound_goes_back(libc):
  out = subprocess.run([sys.executable, "-c", PAST_THE_BOUND],
                       capture_output=True, text=True, timeout=120,
                       check=True)
  freed_at, after = map(int, out.stdout.split()[-2:])
  assert after <= freed_at - 192, (freed_at, after)
