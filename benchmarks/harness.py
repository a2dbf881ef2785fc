"""Shared set-up for benchmarks: both backends in one process, JSON lines.

Every benchmark compares jax_pathways with plain in-process JAX on the same
number of CPU devices, measured in the same run and interleaved (A, B, A, B,
...), because the machine is shared and absolute times drift. Import this
module before anything initializes JAX.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

# Both backends: 'proxy' (jax_pathways, the default) and 'cpu' (reference).
os.environ["JAX_PLATFORMS"] = "proxy,cpu"

import jax  # noqa: E402

import jax_pathways  # noqa: E402

DEVICES = 4


def setup(islands: int = 1, devices_per_island: int = DEVICES,
          **cluster: Any) -> tuple[list[Any], list[Any]]:
  """Starts the embedded cluster (`cluster`: more initialize() options);
  returns (pathways devices, cpu devices): every island's devices and as
  many in-process CPU devices."""
  n = islands * devices_per_island
  jax.config.update("jax_num_cpu_devices", n)
  jax_pathways.initialize(islands=islands,
                          devices_per_island=devices_per_island, **cluster)
  CONTEXT["devices"] = n
  return jax.devices("proxy")[:n], jax.devices("cpu")[:n]


def _commit() -> str:
  try:
    return subprocess.check_output(
        ["git", "rev-parse", "--short", "HEAD"], text=True,
        cwd=os.path.dirname(os.path.abspath(__file__)),
        stderr=subprocess.DEVNULL).strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


CONTEXT = {
    "machine": platform.node(),
    "cpus": os.cpu_count(),
    "devices": DEVICES,
    "jax": jax.__version__,
    "commit": _commit(),
}


def emit(benchmark: str, case: str, **values: Any) -> None:
  """One JSON line per case on stdout."""
  print(json.dumps({"benchmark": benchmark, "case": case, **values,
                    **CONTEXT}), flush=True)


def interleaved(runs: dict[str, Callable[[], float]], repeats: int
                ) -> dict[str, float]:
  """Median of each run's result, the runs alternating `repeats` times."""
  results: dict[str, list[float]] = {name: [] for name in runs}
  for _ in range(repeats):
    for name, run in runs.items():
      results[name].append(run())
  return {name: statistics.median(v) for name, v in results.items()}


def timed(fn: Callable[[], Any]) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def log(*args: Any) -> None:
  print(*args, file=sys.stderr, flush=True)
