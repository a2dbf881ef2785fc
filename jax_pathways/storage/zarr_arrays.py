"""Zarr arrays: a worker writes and reads its shards of an array with tensorstore.

The layout is orbax's own for an array without OCDBT (what its
CloudPathwaysArrayHandler records): a zarr v2 array at `<location>/<name>`,
one chunk per distinct shard, zstd level 1. Each shard is written once, by
the worker holding its first replica, so a checkpoint written by the
islands is read by plain orbax in one process, and the reverse. A read
opens whatever is there: a zarr array, or one inside the OCDBT database
plain orbax writes by default (`<location>/manifest.ocdbt`), and reads the
slices this worker's devices hold, in any sharding (resharding on read).

Missing chunks are an error, not zeros: a checkpoint cut short must not
restore as if it were whole. Every wait is bounded by the request's timeout.
"""
from __future__ import annotations

import contextlib
import os
import re
from typing import Any, Iterator, Sequence

import jax
import numpy as np
import tensorstore as ts

from jax_pathways.status import Code, StatusError
from jax_pathways.storage import paths

# orbax's default compression (tensorstore_utils._build_zarr2_metadata).
_COMPRESSOR = {"id": "zstd", "level": 1}
_OCDBT_MANIFEST = "manifest.ocdbt"
# The spec tensorstore appends to its errors: long, and no news to the user.
_SPEC = re.compile(r" \[tensorstore_spec='.*'\]$", re.DOTALL)


def save(array: jax.Array, location: str, name: str, root: str | None,
         timeout_s: float) -> None:
  """Writes the shards of `array` this worker holds first (replica 0)."""
  kvstore = paths.confine(root, f"{location.rstrip('/')}/{name}")
  first = [s for s in array.addressable_shards if s.replica_id == 0]
  # Every worker names the same chunks, whether it holds a first replica
  # or not.
  chunk = list(array.sharding.shard_shape(array.shape))
  spec = {"driver": "zarr", "kvstore": kvstore, "dtype": array.dtype.name,
          "metadata": {"shape": list(array.shape), "chunks": chunk,
                       "compressor": _COMPRESSOR}}
  with _naming(name, location, "saving"):
    # Every worker opens it; the first creates its metadata, the others
    # find the same (tensorstore's create is a conditional write).
    store = ts.open(spec, create=True, open=True).result(timeout=timeout_s)
    writes = [store[s.index].write(np.asarray(s.data)) for s in first]
    for w in writes:
      w.result(timeout=timeout_s)


def load(location: str, name: str, shape: Sequence[int], dtype: str,
         sharding: jax.sharding.Sharding, devices: Sequence[Any],
         root: str | None, timeout_s: float) -> list[np.ndarray]:
  """The slices of the stored array that `devices` (this worker's, of
  `sharding`) hold, in their order."""
  path = f"{location.rstrip('/')}/{name}"
  kvstore = paths.confine(root, path)
  if isinstance(kvstore, dict):  # a directory: perhaps an OCDBT database
    base = paths.confine(root, location)
    if os.path.exists(os.path.join(base["path"], _OCDBT_MANIFEST)):
      kvstore = {"driver": "ocdbt", "base": base, "path": name + "/"}
  spec = {"driver": "zarr", "kvstore": kvstore,
          "fill_missing_data_reads": False,
          "recheck_cached_data": False, "recheck_cached_metadata": False}
  with _naming(name, location, "restoring"):
    store = ts.open(spec, open=True, read=True).result(timeout=timeout_s)
    stored = (store.dtype.numpy_dtype.name, list(store.shape))
    if stored != (dtype, list(shape)):
      raise StatusError(
          Code.INVALID_ARGUMENT,
          f"{path} holds {stored[0]}{stored[1]}; the restore asks for "
          f"{dtype}{list(shape)}")
    index = sharding.devices_indices_map(tuple(shape))
    reads: dict[Any, Any] = {}
    for d in devices:
      key = _key(index[d])
      if key not in reads:
        reads[key] = store[index[d]].read()
    return [reads[_key(index[d])].result(timeout=timeout_s) for d in devices]


def _key(index: tuple[slice, ...]) -> tuple[Any, ...]:
  return tuple((s.start, s.stop) for s in index)


@contextlib.contextmanager
def _naming(name: str, location: str, doing: str) -> Iterator[None]:
  """Says which array failed: tensorstore's errors name files, not arrays."""
  what = f"{doing} array {name!r} under {location}"
  try:
    yield
  except StatusError:
    raise
  except TimeoutError as e:
    raise StatusError(Code.DEADLINE_EXCEEDED,
                      f"{what}: not done within the request's timeout") from e
  except Exception as e:  # pylint: disable=broad-except
    # "CODE: words [tensorstore_spec='...']": the code, then the words.
    code, _, words = _SPEC.sub("", str(e)).partition(": ")
    if code not in Code.__members__ or code == "OK":
      code, words = "UNKNOWN", str(e)
    raise StatusError(Code[code], f"{what}: {words}") from e
