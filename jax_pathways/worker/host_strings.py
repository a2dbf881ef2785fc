"""HostStrings: a string array a worker holds, as JAX holds them, on the host.

colocated_python's output-spec discovery returns the function's output
specs as a string scalar on every device; the client reads one shard of it
(DisassembleIntoSingleDeviceArrays, CopyToHostBuffer). PJRT has no string
buffers, so the worker keeps the strings themselves under the array's
buffer id: a shard is one, a fetch sends IFRT's serialized string
contents (xla.ifrt.proto.StringArrayContents), as the proxy client reads
them.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from jax_pathways.wire import protos


@dataclasses.dataclass(frozen=True)
class HostStrings:
  """One array of strings per device of this worker, in sharding order."""
  shards: tuple[np.ndarray, ...]

  @property
  def nbytes(self) -> int:
    return sum(len(str(s).encode()) for a in self.shards for s in a.flat)

  def shard(self, i: int) -> "HostStrings":
    return HostStrings((self.shards[i],))

  def contents(self) -> bytes:
    """What the client's CopyToHostBuffer of one shard reads."""
    proto = protos.msg("xla.ifrt.proto.StringArrayContents")()
    proto.strings.extend(str(s).encode() for s in self.shards[0].flat)
    return proto.SerializeToString()


def from_values(values: list[str], shape: tuple[int, ...]) -> HostStrings:
  """One shard per value (each of `shape`, filled with it)."""
  return HostStrings(tuple(np.full(shape, v, dtype=np.dtypes.StringDType())
                           for v in values))
