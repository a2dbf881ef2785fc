"""Plan: one compiled pipeline step for one set of argument shapes, whichever
partitioner made it (Shardy's: pipeline.py; jax_pathways' own splitter:
fallback.py)."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from jax.sharding import NamedSharding

from jax_pathways.mpmd import schedule as schedule_lib


@dataclasses.dataclass
class Plan:
  """What a pipeline runs for one set of argument shapes."""
  schedule: schedule_lib.Schedule
  run: Callable[[list[Any]], list[Any]]
  input_shardings: list[NamedSharding]
  out_tree: Any
  ifrt_ir: str | None = None  # the program compiled, where Shardy made one
