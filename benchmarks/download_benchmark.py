"""Device to host: `np.asarray` of an array on an island.

    python benchmarks/download_benchmark.py [--repeats 7] [--sizes 16B,4KB]
        [--platform cuda --devices 1]

The bytes go worker -> controller (an event's payload) -> client (the IFRT
proxy's host-buffer channel), each array fetched once (JAX keeps an array's
host copy after the first fetch). In the same run, in-process JAX: reading
an array of a local CPU device (a view of its buffer, no copy) and copying
it into a fresh host array (what the bytes' last hop costs at least: a
fresh buffer, first-touch page faults, a copy). Prints one JSON line per
size, with each process's CPU time per download. 16B/4: a 16-byte array
replicated over the island's 4 devices (a data-parallel loss); 16B/4s:
split over them.
"""
from __future__ import annotations

import argparse
import statistics
import time

from harness import (add_platform_args, cpu_seconds, emit_host_transfer,  # pylint: disable=g-bad-import-order
                     log, one_island_processes)

import jax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402
import numpy as np  # noqa: E402


# Label -> (bytes, devices, sharded over them or replicated). 16B: a logged
# loss, what a read costs when there are no bytes to speak of; 16B/4: a
# data-parallel loss, replicated over the island's 4 devices; 16B/4s: 16
# bytes split over them (np.asarray reads each shard).
SIZES = {"16B": (16, 1, False), "4KB": (4 << 10, 1, False),
         "1MB": (1 << 20, 1, False), "16MB": (16 << 20, 1, False),
         "16B/4": (16, 4, False), "16B/4s": (16, 4, True)}


def fetch_ms(arrays: list[jax.Array], copy: bool) -> list[float]:
  """Fetches each array once; its time in ms."""
  out = []
  for a in arrays:
    t0 = time.perf_counter()
    np.array(a, copy=True) if copy else np.asarray(a)
    out.append((time.perf_counter() - t0) * 1e3)
  return out


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--sizes", default=",".join(SIZES),
                      help="comma-separated, of " + ", ".join(SIZES))
  add_platform_args(parser)
  args = parser.parse_args()
  labels = args.sizes.split(",")
  unknown = [x for x in labels if x not in SIZES]
  if unknown:
    parser.error(f"unknown sizes {unknown}; choose from {list(SIZES)}")
  pathways, local, pids = one_island_processes(platform=args.platform,
                                               devices=args.devices)
  for label in labels:
    size, n, split = SIZES[label]
    if n > args.devices:
      log(f"{label}: skipped, it needs {n} devices")
      continue
    on_pathways, on_local = (
        NamedSharding(Mesh(np.array(devices[:n]), ("d",)),
                      P("d") if split else P())
        for devices in (pathways, local))
    data = np.random.default_rng(0).random(size // 4, dtype=np.float32)
    fetches = min(1024, max(2, (64 << 20) // size // 16))  # ~4 MB a sample
    times: dict[str, list[float]] = {"pathways": [], "jax_view": [],
                                     "jax_copy": []}
    cpu_s = dict.fromkeys(pids, 0.0)
    # Interleaved, fresh arrays each time; the first round warms buffer
    # pools up to this size and is not counted.
    for repeat in range(-1, args.repeats):
      for case, device in (("pathways", on_pathways),
                           ("jax_view", on_local), ("jax_copy", on_local)):
        arrays = [jax.device_put(data, device) for _ in range(fetches)]
        jax.block_until_ready(arrays)
        before = {k: cpu_seconds(p) for k, p in pids.items()}
        ms = fetch_ms(arrays, copy=case == "jax_copy")
        if repeat < 0:
          continue
        times[case].append(statistics.median(ms))
        if case == "pathways":
          for k, p in pids.items():
            cpu_s[k] += (cpu_seconds(p) - before[k]) / fetches
        del arrays
    med = {k: statistics.median(v) for k, v in times.items()}
    cpu_ms = {k: round(v / args.repeats * 1e3, 2) for k, v in cpu_s.items()}
    emit_host_transfer("download", label, size, med, "jax_copy", cpu_ms)


if __name__ == "__main__":
  main()
