"""Array: the controller's record of one client array.

The bytes live on the workers of `islands` (one island, or several for an
array that spans islands), under the same `buffer` id on each; the
controller keeps what it needs to place work on them. A request that could not produce its
arrays leaves Arrays with `error` set under the client's handles, so the
failure reaches the user at the next synchronous call, as IFRT specifies.
"""
from __future__ import annotations

import dataclasses

from jax_pathways.programs.sharding import Sharding
from jax_pathways.resources.island import Island
from jax_pathways.status import Code, Status, StatusError


@dataclasses.dataclass
class Array:
  buffer: int
  islands: tuple[Island, ...]
  dtype: str
  shape: tuple[int, ...]
  sharding: Sharding | None
  deleted: bool = False       # deleted or donated: no longer usable
  released: bool = False      # its buffer's DELETE op has been sent
  error: Status | None = None

  @classmethod
  def failed(cls, status: Status) -> "Array":
    return cls(0, (), "", (), None, error=status)

  def check_usable(self) -> None:
    """Raises the error a request using this array should fail with."""
    if self.error is not None:
      raise StatusError(self.error.code, self.error.message)
    if self.deleted:
      raise StatusError(Code.FAILED_PRECONDITION, "Array has been deleted.")
