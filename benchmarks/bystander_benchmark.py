"""Whose stall is another client's worst round trip during a big get?

    python benchmarks/bystander_benchmark.py [--mib 512] [--gets 8]

A CLI cluster (a controller and 2 workers of 4 CPU devices each, processes
of their own). One client reads a fresh row-sharded array of `--mib` MiB
back `--gets` times (`np.asarray`); meanwhile another client makes round
trips of a jitted `x + 1` on island 1 without pause
(big_transfer_benchmark.Bystander). Twice, in the same invocation: the
reading client free to use every core, then confined to one core
(`taskset -c 0`) while the controller, the workers and the other client
keep all of them. Then, instead of a reader, a process with no JAX that
fills fresh 64 MiB NumPy arrays on 4 threads for as long as the first
reader took: what a load that never touches the controller costs the
other client on these cores. Where the other client's tail beside a
reader matches it, the stall is the machine's, not the controller's that
carries the reader's bytes.
Prints one JSON line per run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from big_transfer_benchmark import ISLANDS, Bystander, child_env, cli_cluster, read_json, trip_stats  # noqa: E402  pylint: disable=wrong-import-position

# The reading client: the array made once, then a fresh copy per get.
READER = """
import json, sys, time
import numpy as np
import jax_pathways
jax_pathways.initialize(sys.argv[1])
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
mib, gets = int(sys.argv[2]), int(sys.argv[3])
sharding = NamedSharding(Mesh(np.array(jax.devices()), ("d",)),
                         PartitionSpec("d", None))
x = jax.device_put(np.arange((mib << 20) // 4, dtype=np.float32)
                   .reshape(-1, 4096), sharding)
fresh = jax.jit(lambda v: v + 0, out_shardings=sharding)
np.asarray(fresh(x))
print(json.dumps({"ready": True}), flush=True)
sys.stdin.readline()
times = []
for _ in range(gets):
  y = fresh(x)
  y.block_until_ready()
  start = time.perf_counter()
  np.asarray(y)
  times.append(time.perf_counter() - start)
  del y
print(json.dumps({"get_s": sorted(times)}), flush=True)
"""

# No JAX: fresh memory filled on 4 threads for argv[1] seconds.
MEMORY_LOAD = """
import sys, threading, time
import numpy as np
end = time.monotonic() + float(sys.argv[1])
def fill():
  while time.monotonic() < end:
    a = np.empty((64 << 20) // 4, np.float32)
    a[:] = 1
    del a
threads = [threading.Thread(target=fill) for _ in range(4)]
for t in threads:
  t.start()
for t in threads:
  t.join()
"""


def _run(address: str, env: dict[str, str], other: Bystander, mib: int,
         gets: int, pin: list[str]) -> dict[str, Any]:
  reader = subprocess.Popen(
      [*pin, sys.executable, "-c", READER, address, str(mib), str(gets)],
      env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
      cwd="/", start_new_session=True)
  try:
    assert read_json(reader) == {"ready": True}

    def read() -> dict[str, Any]:
      reader.stdin.write("go\n")
      reader.stdin.flush()
      return read_json(reader)
    result, trips = other.during(read)
  finally:
    reader.kill()
    reader.wait()
  times = result["get_s"]
  return {"reader": " ".join(pin) or "every core", "mib": mib,
          "get_median_s": round(times[len(times) // 2], 3),
          **_trips(trips)}


def _trips(trips: list[float]) -> dict[str, float]:
  stats = trip_stats(trips)
  return {"other_client_median_ms": round(stats["median_ms"], 2),
          "other_client_p99_ms": round(stats["p99_ms"], 2),
          "other_client_max_ms": round(stats["max_ms"], 2),
          "trips": stats["trips"]}


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--mib", type=int, default=512)
  parser.add_argument("--gets", type=int, default=8)
  args = parser.parse_args()
  env = child_env()
  procs: list[subprocess.Popen] = []
  try:
    address = cli_cluster(procs, [[]] * ISLANDS)
    other = Bystander(address, "")
    procs.append(other.proc)
    start = time.perf_counter()
    free = _run(address, env, other, args.mib, args.gets, [])
    seconds = time.perf_counter() - start
    pinned = _run(address, env, other, args.mib, args.gets,
                  ["taskset", "-c", "0"])
    for row in (free, pinned):
      print(json.dumps({"benchmark": "bystander", **row}), flush=True)
    _, trips = other.during(lambda: subprocess.run(
        [sys.executable, "-c", MEMORY_LOAD, str(seconds)], check=True))
    print(json.dumps({"benchmark": "bystander",
                      "reader": "none: NumPy filling fresh memory, 4 threads",
                      "seconds": round(seconds, 1),
                      **_trips(trips)}), flush=True)
  finally:
    for p in procs:
      p.kill()
      p.wait()


if __name__ == "__main__":
  main()
