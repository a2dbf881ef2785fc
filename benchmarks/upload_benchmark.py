"""Host to device: `jax.device_put` of a numpy array onto an island.

    python benchmarks/upload_benchmark.py [--repeats 7]

The bytes go client -> controller (the IFRT proxy's host-buffer channel)
-> the island's worker, waited for each time; in-process JAX putting the
same array on a local CPU device in the same run gives the ratio. A
pipeline fed numpy batches pays this every step. The "/4" case puts the
array sharded by rows over the island's 4 devices (one upload per shard),
as a data-parallel batch is put. Prints one JSON line per case, with each
process's CPU time per upload.
"""
from __future__ import annotations

import argparse
import os

from harness import emit, interleaved, log, setup, timed  # pylint: disable=g-bad-import-order

import jax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402
import numpy as np  # noqa: E402

import jax_pathways  # noqa: E402

# case -> (bytes, devices the array is sharded over)
CASES = {"4KB": (4 << 10, 1), "1MB": (1 << 20, 1), "16MB": (16 << 20, 1),
         "16MB/4": (16 << 20, 4)}
_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
  """User + system CPU time of process `pid` so far."""
  with open(f"/proc/{pid}/stat") as f:
    fields = f.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) * _TICK_S


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--repeats", type=int, default=7)
  args = parser.parse_args()
  pathways, cpu = setup(islands=1)
  cluster = jax_pathways.local_cluster()
  pids = {"client": os.getpid(), "controller": cluster.controller.pid,
          "worker": cluster.workers[0].pid}
  for label, (size, shards) in CASES.items():
    data = np.random.default_rng(0).random((shards, size // 4 // shards),
                                           dtype=np.float32)
    puts = max(1, (64 << 20) // size // 16)  # ~4 MB of puts per sample

    def case(devices):
      where = (devices[0] if shards == 1 else NamedSharding(
          Mesh(np.array(devices[:shards]), ("d",)), PartitionSpec("d")))

      def run() -> float:
        def go():
          for _ in range(puts):
            jax.device_put(data, where).block_until_ready()
        return timed(go) / puts
      run()  # warm up
      return run

    before = {k: cpu_seconds(p) for k, p in pids.items()}
    med = interleaved({"pathways": case(pathways), "jax": case(cpu)},
                      args.repeats)
    n = (args.repeats + 1) * puts
    cpu_ms = {k: round((cpu_seconds(p) - before[k]) / n * 1e3, 2)
              for k, p in pids.items() if k != "client"}
    emit("upload", label, bytes=size, shards=shards,
         pathways_us=round(med["pathways"] * 1e6, 1),
         jax_us=round(med["jax"] * 1e6, 1),
         pathways_gbps=round(size / med["pathways"] / 1e9, 3),
         ratio=round(med["pathways"] / med["jax"], 2),
         cpu_ms_per_upload=cpu_ms)
    log(f"{label:5s} upload {med['pathways'] * 1e6:9.1f} us "
        f"({size / med['pathways'] / 1e9:.2f} GB/s)   in-process "
        f"{med['jax'] * 1e6:8.1f} us   ratio "
        f"{med['pathways'] / med['jax']:.2f}   CPU ms per upload {cpu_ms}")


if __name__ == "__main__":
  main()
