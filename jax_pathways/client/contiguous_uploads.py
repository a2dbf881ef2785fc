"""Uploads of strided numpy shards carry their own elements only.

JAX puts a numpy array on a sharding by slicing it per device (`x[index]`,
a view) and handing the views to jaxlib. For a view that is not contiguous
(a column shard of a row-major array), jaxlib's proxy client uploads the
whole region of memory the view spans: each of 8 column shards of an array
crossed as nearly the whole array, to the controller and on to the workers
(a 512 MiB array sharded by columns over 8 devices took 14 s to put,
against 2 s by rows; one of 2 GiB took the controller past 17 GiB of
memory, until the kernel killed it). Here a strided view goes as a
contiguous copy of its own elements instead: one copy of 1/n of the array
in this process, what the bytes cost anyway on their way to the devices.

The copy is written once and read once by the transfer, so it is kept off
huge pages, which NumPy asks for (MADV_HUGEPAGE) and which buy a single
pass nothing: a huge page's first touch needs a whole free 2 MiB block,
which the kernel may compact memory to find, and which a VM whose balloon
reports free memory to its host (the test machine) has most likely handed
back. There, copying 2 GiB of column shards took 0.6-19 s on huge pages
(mostly the kernel zeroing them in their faults: clear_page, perf) and
1.8-5.5 s (median 2.3) on small ones (docs/benchmarks.md, "Big
transfers").
"""
from __future__ import annotations

import ctypes
import functools
import mmap
from typing import Any, Sequence

import numpy as np

_PAGE = mmap.PAGESIZE
_HUGE_PAGE = 2 << 20


def install() -> None:
  """Wraps JAX's batched_device_put (once; listed with the other patches
  in docs/limitations.md)."""
  from jax._src.interpreters import pxla  # pylint: disable=import-outside-toplevel
  put = pxla.batched_device_put
  if getattr(put, "_jax_pathways", False):
    return

  @functools.wraps(put)
  def contiguous_put(aval: Any, sharding: Any, xs: Sequence[Any],
                     devices: Sequence[Any], *args: Any, **kwargs: Any
                     ) -> Any:
    if devices and _proxy(devices[0]):
      xs = [_contiguous(x) if _strided(x) else x for x in xs]
    return put(aval, sharding, xs, devices, *args, **kwargs)

  contiguous_put._jax_pathways = True  # type: ignore[attr-defined]
  pxla.batched_device_put = contiguous_put


def _proxy(device: Any) -> bool:
  return getattr(device.client, "runtime_type", "").startswith("proxy")


def _strided(x: Any) -> bool:
  return isinstance(x, np.ndarray) and not x.flags.c_contiguous


def _contiguous(x: np.ndarray) -> np.ndarray:
  """A C-contiguous copy of `x`, on small pages (see above)."""
  out = np.empty(x.shape, x.dtype)
  _no_huge_pages(out)
  np.copyto(out, x)
  return out


def _no_huge_pages(x: np.ndarray) -> None:
  """Advises the kernel to back `x`'s whole pages with small ones (before
  they are touched; best effort: a refusal leaves them as they were)."""
  start = -(-x.ctypes.data // _PAGE) * _PAGE
  end = (x.ctypes.data + x.nbytes) // _PAGE * _PAGE
  if end - start >= _HUGE_PAGE and _madvise is not None:
    _madvise(start, end - start, mmap.MADV_NOHUGEPAGE)


def _libc_madvise() -> Any:
  if not hasattr(mmap, "MADV_NOHUGEPAGE"):  # not Linux
    return None
  fn = getattr(ctypes.CDLL(None), "madvise", None)
  if fn is not None:
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
  return fn


_madvise = _libc_madvise()
