"""A strided shard's upload copy is C-contiguous and kept off huge pages."""
import re

import numpy as np
import pytest

from jax_pathways.client import contiguous_uploads

SIZE = 32 << 20  # several 2 MiB huge pages


def _vm_flags(address: int) -> list[str]:
  """The kernel's VmFlags of the mapping holding `address`."""
  span = None
  with open("/proc/self/smaps", encoding="ascii") as smaps:
    for line in smaps:
      m = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
      if m:
        span = (int(m[1], 16), int(m[2], 16))
      elif (line.startswith("VmFlags:") and span
            and span[0] <= address < span[1]):
        return line.split()[1:]
  raise AssertionError(f"no mapping holds {address:#x}")


def _middle(x: np.ndarray) -> int:
  return x.ctypes.data + x.nbytes // 2


@pytest.fixture(scope="module")
def numpy_asks_for_huge_pages() -> None:
  plain = np.empty(SIZE, np.uint8)
  if "hg" not in _vm_flags(_middle(plain)):
    pytest.skip("NumPy does not ask this kernel for huge pages here")


def test_a_column_shard_copies_on_small_pages(numpy_asks_for_huge_pages):
  x = np.arange(SIZE // 4, dtype=np.float32).reshape(-1, 1024)
  shard = x[:, 256:512]
  copy = contiguous_uploads._contiguous(shard)  # pylint: disable=protected-access
  assert copy.flags.c_contiguous
  np.testing.assert_array_equal(copy, shard)
  flags = _vm_flags(_middle(copy))
  assert "nh" in flags and "hg" not in flags, flags


def test_a_small_shard_is_copied_as_it_is():
  x = np.arange(64, dtype=np.int32).reshape(8, 8)
  copy = contiguous_uploads._contiguous(x[:, ::2])  # pylint: disable=protected-access
  assert copy.flags.c_contiguous
  np.testing.assert_array_equal(copy, x[:, ::2])
