"""A worker's shards written and read with tensorstore, in this process (the
8 CPU devices stand for one worker holding every shard); across islands:
persistence_test.py."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jax_pathways.status import Code, StatusError
from jax_pathways.storage import zarr_arrays


@pytest.fixture
def mesh(cpu_devices) -> Mesh:
  return Mesh(np.array(cpu_devices).reshape(2, 4), ("data", "model"))


def _load(root, sharding, shape, dtype, name="w"):
  mine = list(sharding._device_assignment)  # pylint: disable=protected-access
  pieces = zarr_arrays.load(f"{root}/ck", name, shape, dtype, sharding,
                            mine, str(root), 30.0)
  return jax.make_array_from_single_device_arrays(
      shape, sharding, [jax.device_put(p, d) for p, d in zip(pieces, mine)])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_saved_shards_read_back_in_another_sharding(tmp_path, mesh, dtype):
  values = (np.arange(16 * 12) % 97).reshape(16, 12).astype(jnp.dtype(dtype))
  array = jax.device_put(values, NamedSharding(mesh, P("data", "model")))
  zarr_arrays.save(array, f"{tmp_path}/ck", "w", str(tmp_path), 30.0)
  # One chunk per distinct shard, as orbax lays it out.
  assert len([f for f in os.listdir(tmp_path / "ck" / "w")
              if not f.startswith(".")]) == 8
  back = _load(tmp_path, NamedSharding(mesh, P("model", None)), (16, 12),
               dtype)
  assert back.dtype == values.dtype
  np.testing.assert_array_equal(np.asarray(back), values)


def _saved(tmp_path, mesh) -> np.ndarray:
  values = np.arange(64, dtype=np.float32).reshape(8, 8)
  zarr_arrays.save(jax.device_put(values, NamedSharding(mesh, P("data"))),
                   f"{tmp_path}/ck", "w", str(tmp_path), 30.0)
  return values


def _refused(tmp_path, mesh, code, match, shape=(8, 8), dtype="float32"):
  with pytest.raises(StatusError, match=match) as e:
    _load(tmp_path, NamedSharding(mesh, P()), shape, dtype)
  assert e.value.status.code == code


def test_a_checkpoint_cut_short_is_an_error_not_zeros(tmp_path, mesh):
  _saved(tmp_path, mesh)
  os.remove(tmp_path / "ck" / "w" / "1.0")
  _refused(tmp_path, mesh, Code.NOT_FOUND,
           r"restoring array 'w' under .*/ck: chunk \{1, 0\}.* is missing")


def test_a_corrupted_chunk_is_an_error_naming_the_array(tmp_path, mesh):
  _saved(tmp_path, mesh)
  chunk = tmp_path / "ck" / "w" / "0.0"
  chunk.write_bytes(chunk.read_bytes()[:7])  # truncated
  with pytest.raises(StatusError, match="restoring array 'w' under") as e:
    _load(tmp_path, NamedSharding(mesh, P()), (8, 8), "float32")
  assert e.value.status.code != Code.OK


def test_a_shape_or_dtype_other_than_stored_is_refused(tmp_path, mesh):
  _saved(tmp_path, mesh)
  _refused(tmp_path, mesh, Code.INVALID_ARGUMENT,
           r"holds float32\[8, 8\]; the restore asks for int32\[8, 8\]",
           dtype="int32")
  _refused(tmp_path, mesh, Code.INVALID_ARGUMENT, r"asks for float32\[4, 16\]",
           shape=(4, 16))


def test_nothing_is_read_or_written_outside_the_root(tmp_path, mesh):
  root = tmp_path / "root"
  root.mkdir()
  array = jax.device_put(np.ones(8, np.float32), NamedSharding(mesh, P()))
  with pytest.raises(StatusError, match="outside the storage root"):
    zarr_arrays.save(array, f"{tmp_path}/ck", "w", str(root), 30.0)
  assert not (tmp_path / "ck").exists()
