"""HostStrings: a string array a worker holds, as JAX holds them, on the host.

String arrays are what colocated_python functions pass around (its
output-spec discovery returns the specs as a string scalar on every
device; users' functions take and make them). PJRT has no string buffers,
so the worker keeps the strings themselves under the array's buffer id,
one numpy StringDType array per device: an upload and a fetch carry IFRT's
serialized string contents (xla.ifrt.proto.StringArrayContents), as the
proxy client writes and reads them; its colocated processes get them as
JSON lists (colocated/frames.py).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from jax_pathways.status import invalid_argument
from jax_pathways.wire import protos


@dataclasses.dataclass(frozen=True)
class HostStrings:
  """One array of strings per device of this worker, in sharding order."""
  shards: tuple[np.ndarray, ...]

  def shard(self, i: int) -> "HostStrings":
    return HostStrings((self.shards[i],))

  def contents(self) -> bytes:
    """What the client's CopyToHostBuffer of one shard reads."""
    proto = protos.msg("xla.ifrt.proto.StringArrayContents")()
    proto.strings.extend(str(s).encode() for s in self.shards[0].flat)
    return proto.SerializeToString()


def parse(contents: bytes | memoryview, shape: Sequence[int]) -> np.ndarray:
  """An upload's StringArrayContents, as an array of `shape`."""
  proto = protos.msg("xla.ifrt.proto.StringArrayContents")()
  try:
    proto.ParseFromString(bytes(contents))
  except Exception:  # pylint: disable=broad-except
    raise invalid_argument("a string array's contents do not parse as "
                           "StringArrayContents") from None
  if len(proto.strings) != math.prod(shape):
    raise invalid_argument(f"{len(proto.strings)} strings for an array of "
                           f"shape {list(shape)}")
  return _array([s.decode(errors="replace") for s in proto.strings], shape)


def _array(values: list[str], shape: Sequence[int]) -> np.ndarray:
  return np.array(values, dtype=np.dtypes.StringDType()).reshape(tuple(shape))
