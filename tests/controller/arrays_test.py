"""Array records: what a donation makes unusable."""
import pytest

from jax_pathways.controller.arrays import Array
from jax_pathways.status import StatusError


def _array(buffer: int) -> Array:
  return Array(buffer, (), "float32", (4,), None)


def test_donating_an_array_consumes_those_sharing_its_memory():
  shard, other, assembled = _array(1), _array(2), _array(3)
  assembled.shares_memory_with(shard)
  assembled.shares_memory_with(other)
  alias = assembled.alias(None)
  assembled.donate()
  for a in (shard, other, alias):
    with pytest.raises(StatusError, match="deleted"):
      a.check_usable()


def test_a_released_buffer_is_forgotten_by_those_it_shared_with():
  shard, assembled = _array(1), _array(2)
  assembled.shares_memory_with(shard)
  assert shard.release()
  assert not assembled.shared.shares and not shard.shared.shares
