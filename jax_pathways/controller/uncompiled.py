"""The metadata of executables that compile no XLA program.

Profiling, persistence requests and colocated_python functions are
executables to the client, which asks each for the metadata of an XLA
executable (loaded_executable_metadata_request): none of theirs has
shardings, donations, memory statistics or HLO; outputs are row-major, as
workers make them.
"""
from __future__ import annotations

from typing import Any, Sequence


def metadata(name: str, output_ranks: Sequence[int]) -> dict[str, Any]:
  return {
      "name": name, "parameter_shardings": None, "output_shardings": None,
      "parameter_layouts": [],
      "output_layouts": [list(range(rank))[::-1] for rank in output_ranks],
      "output_memory_kinds": [], "donated_input_indices": [],
      "memory_stats": {}, "cost_analysis": {}, "hlo_text": ""}
