"""Host to device: `jax.device_put` of a numpy array onto an island.

    python benchmarks/upload_benchmark.py [--repeats 7] [--cases 4KB,16MB]
        [--workers-over-tcp] [--platform cuda --devices 1]

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

from harness import (add_platform_args, cpu_seconds, emit_host_transfer,  # pylint: disable=g-bad-import-order
                     interleaved, log, one_island_processes, timed)

import jax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402
import numpy as np  # noqa: E402


# case -> (bytes, devices the array is sharded over)
CASES = {"4KB": (4 << 10, 1), "1MB": (1 << 20, 1), "4MB": (4 << 20, 1),
         "16MB": (16 << 20, 1),
         "16MB/4": (16 << 20, 4)}


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--cases", default=",".join(CASES),
                      help="comma-separated, of " + ", ".join(CASES))
  parser.add_argument("--workers-over-tcp", action="store_true",
                      help="the worker connects over loopback TCP, as one "
                      "on another host (uploads are sent to it, not read "
                      "from the controller's memory)")
  add_platform_args(parser)
  args = parser.parse_args()
  pathways, local, pids = one_island_processes(args.workers_over_tcp,
                                               args.platform, args.devices)
  for label in args.cases.split(","):
    size, shards = CASES[label]
    if shards > args.devices:
      log(f"{label}: skipped, it needs {shards} devices")
      continue
    data = np.random.default_rng(0).random((shards, size // 4 // shards),
                                           dtype=np.float32)
    puts = max(3, (64 << 20) // size // 16)  # ~4 MB of puts per sample

    def case(devices):
      where = (devices[0] if shards == 1 else NamedSharding(
          Mesh(np.array(devices[:shards]), ("d",)), PartitionSpec("d")))

      def run() -> float:
        def go():
          for _ in range(puts):
            jax.device_put(data, where).block_until_ready()
        return timed(go) / puts
      # Warm up: at least 4 puts, so buffer pools hold this size (on
      # fresh memory the first 16 MB puts cost 3x, in process too).
      for _ in range(max(1, 4 // puts)):
        run()
      return run

    runs = {"pathways": case(pathways), "jax": case(local)}
    before = {k: cpu_seconds(p) for k, p in pids.items()}
    med = interleaved(runs, args.repeats)
    n = args.repeats * puts
    cpu_ms = {k: round((cpu_seconds(p) - before[k]) / n * 1e3, 2)
              for k, p in pids.items() if k != "client"}
    emit_host_transfer("upload", label, size,
                       {k: v * 1e3 for k, v in med.items()}, "jax", cpu_ms,
                       shards=shards, workers_over_tcp=args.workers_over_tcp)


if __name__ == "__main__":
  main()
