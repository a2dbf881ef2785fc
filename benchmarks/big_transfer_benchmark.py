"""Big transfers: `jax.device_put` and `np.asarray` of 64 MiB to 2 GiB.

    python benchmarks/big_transfer_benchmark.py [--sizes 64,512,2048]
        [--repeats 3]

A float32 array of each size (MiB), sharded over 2 islands x 4 devices by
rows `P("d", None)`, by columns `P(None, "d")`, and replicated `P()`: put
(waited for) and read back whole (a fresh array each time). Three runs of
each case, in the same invocation:
  plain    in-process JAX on 8 CPU devices;
  pathways the embedded cluster (client -> controller -> workers);
  ceiling  JAX's proxy client against a controller whose islands are
           simulated (`jax-pathways worker --simulate`): they discard
           uploads and answer fetches with zeros, so what is left is what
           the proxy client and the controller's host-buffer path carry,
           no device work (a process of its own: one process has one
           proxy backend), another client making round trips there too.
Beside the pathways runs, another client of the same cluster (a process of
its own) makes round trips of a jitted `x + 1` on island 1 without pause:
its median and worst round trip during each case, against those it had
with the cluster idle, say whether the controller stays responsive to
others while the bytes go by.
Prints one JSON line per case with median seconds and the ratios
pathways/plain and pathways/ceiling (issue 52: within 2x of the
ceiling); a get's plain time is a view of a CPU buffer (no copy) when the
array is replicated, so no get ratio to it is printed then. Replicated cases above
REPLICATED_MAX_MIB are left out (8 copies per run).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

SPECS = {"rows": ("d", None), "columns": (None, "d"), "replicated": ()}
COLS = 4096
ISLANDS, DEVICES = 2, 4
# A replicated array is held 8 times by each run (16 GiB at 2 GiB, past the
# test machine's 23): larger replicated cases are left out.
REPLICATED_MAX_MIB = 512


def _cases(sizes: list[int]) -> list[tuple[int, str]]:
  return [(mib, name) for mib in sizes for name in SPECS
          if name != "replicated" or mib <= REPLICATED_MAX_MIB]


def _measure(devices: list, mib: int, spec: tuple, repeats: int
             ) -> dict[str, float]:
  """Median seconds of a put and of a get of a `mib` MiB array."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=import-outside-toplevel
  data = np.arange((mib << 20) // 4, dtype=np.float32).reshape(-1, COLS)
  sharding = NamedSharding(Mesh(np.array(devices), ("d",)),
                           PartitionSpec(*spec))
  puts, gets = [], []
  for _ in range(repeats):
    start = time.perf_counter()
    x = jax.device_put(data, sharding)
    x.block_until_ready()
    puts.append(time.perf_counter() - start)
    start = time.perf_counter()
    back = np.asarray(x)
    gets.append(time.perf_counter() - start)
    del x, back
  return {"put_s": statistics.median(puts), "get_s": statistics.median(gets)}


def _ceiling_client(address: str, sizes: list[int], repeats: int) -> None:
  """The ceiling's process: one JSON line per case."""
  import jax_pathways  # pylint: disable=import-outside-toplevel
  jax_pathways.initialize(address)
  import jax  # pylint: disable=import-outside-toplevel
  for mib, name in _cases(sizes):
    print(json.dumps({"mib": mib, "spec": name,
                      **_measure(jax.devices(), mib, SPECS[name], repeats)}),
          flush=True)


# Another client: round trips until told to stop, then their median and
# worst in ms (one JSON line per "stop").
BYSTANDER = """
import json, sys, threading, time
import jax_pathways
jax_pathways.initialize(sys.argv[1], token=sys.argv[2] or None)
import jax, numpy as np
x = jax.device_put(np.float32(1), jax.devices()[-1])
step = jax.jit(lambda v: v + 1)
np.asarray(step(x))
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
  if line.strip() != "start":
    break
  stop = threading.Event()
  threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()),
                   daemon=True).start()
  trips = []
  while not stop.is_set():
    t = time.perf_counter()
    np.asarray(step(x))
    trips.append((time.perf_counter() - t) * 1e3)
  trips.sort()
  print(json.dumps({"median_ms": trips[len(trips) // 2],
                    "max_ms": trips[-1], "trips": len(trips)}), flush=True)
"""


class Bystander:
  """The other client: `during(run)` runs `run` while it makes round
  trips, and returns what they took."""

  def __init__(self, address: str, token: str):
    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)
    self._proc = subprocess.Popen(
        [sys.executable, "-c", BYSTANDER, address, token], env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/",
        start_new_session=True)
    assert json.loads(self._line()) == {"ready": True}

  def _line(self) -> str:
    while True:
      line = self._proc.stdout.readline()
      if not line:
        raise RuntimeError("the bystander client exited")
      if line.startswith("{"):
        return line

  def during(self, run: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    self._proc.stdin.write("start\n")
    self._proc.stdin.flush()
    result = run()
    self._proc.stdin.write("stop\n")
    self._proc.stdin.flush()
    return result, json.loads(self._line())

  def close(self) -> None:
    self._proc.kill()
    self._proc.wait()


def _simulated_cluster(procs: list[subprocess.Popen]) -> str:
  """A CLI controller with ISLANDS simulated islands; its client address."""
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)
  cli = [sys.executable, "-m", "jax_pathways.cli"]
  controller = subprocess.Popen(
      [*cli, "controller", "--islands", str(ISLANDS), "--listen",
       "127.0.0.1:0", "--worker-listen", "127.0.0.1:0"], env=env,
      stdout=subprocess.PIPE, text=True, start_new_session=True, cwd="/")
  procs.append(controller)
  ready = json.loads(controller.stdout.readline())
  procs.append(subprocess.Popen(
      [*cli, "worker", "--controller", ready["worker_address"], "--simulate",
       str(ISLANDS), "--devices", str(DEVICES)], env=env,
      stdout=subprocess.DEVNULL, start_new_session=True, cwd="/"))
  return f"grpc://{ready['address']}"


def _ceilings(sizes: list[int], repeats: int) -> dict[tuple[int, str], Any]:
  procs: list[subprocess.Popen] = []
  try:
    address = _simulated_cluster(procs)
    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)
    # Another client makes round trips here too: the pathways runs bear
    # one, and it takes one of the two cores' time.
    other = Bystander(address, "")
    try:
      out, _ = other.during(lambda: subprocess.run(
          [sys.executable, __file__, "--ceiling-client", address, "--sizes",
           ",".join(map(str, sizes)), "--repeats", str(repeats)], env=env,
          capture_output=True, text=True, check=False, cwd="/"))
    finally:
      other.close()
    if out.returncode:
      raise RuntimeError(f"the ceiling's client failed:\n{out.stderr[-3000:]}")
  finally:
    for p in procs:
      p.kill()
      p.wait()
  rows = [json.loads(line) for line in out.stdout.splitlines()
          if line.startswith("{")]
  return {(r["mib"], r["spec"]): r for r in rows}


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--sizes", default="64,512,2048",
                      help="MiB, comma-separated")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--ceiling-client", default=None,
                      help=argparse.SUPPRESS)
  args = parser.parse_args()
  sizes = [int(s) for s in args.sizes.split(",")]
  if args.ceiling_client:
    _ceiling_client(args.ceiling_client, sizes, args.repeats)
    return
  ceilings = _ceilings(sizes, args.repeats)
  sys.path.insert(0, os.path.dirname(__file__))
  from harness import log, setup  # pylint: disable=import-outside-toplevel
  pathways, cpu = setup(islands=ISLANDS, devices_per_island=DEVICES)
  import jax_pathways  # pylint: disable=import-outside-toplevel
  cluster = jax_pathways.local_cluster()
  other = Bystander(cluster.address, cluster.token)
  try:
    _, idle = other.during(lambda: time.sleep(2))
    log(f"another client's round trip, the cluster idle: median "
        f"{idle['median_ms']:.2f} ms, worst {idle['max_ms']:.2f} ms")
    _report(sizes, args.repeats, pathways, cpu, ceilings, other, idle)
  finally:
    other.close()


def _report(sizes: list[int], repeats: int, pathways: list, cpu: list,
            ceilings: dict[tuple[int, str], Any], other: Bystander,
            idle: dict[str, float]) -> None:
  from harness import emit, log  # pylint: disable=import-outside-toplevel
  ratio: Callable[[float, float], float] = lambda a, b: round(a / b, 2)
  for mib, name in _cases(sizes):
    plain = _measure(cpu, mib, SPECS[name], repeats)
    ours, trips = other.during(
        lambda: _measure(pathways, mib, SPECS[name], repeats))
    ceiling = ceilings[(mib, name)]
    emit("big_transfer", f"{mib}MiB/{name}",
         **{f"{k}_{run}": round(v[k], 3) for run, v in
            (("plain", plain), ("pathways", ours), ("ceiling", ceiling))
            for k in ("put_s", "get_s")},
         put_vs_plain=ratio(ours["put_s"], plain["put_s"]),
         **({} if name == "replicated" else
            {"get_vs_plain": ratio(ours["get_s"], plain["get_s"])}),
         put_vs_ceiling=ratio(ours["put_s"], ceiling["put_s"]),
         get_vs_ceiling=ratio(ours["get_s"], ceiling["get_s"]),
         other_client_median_ms=round(trips["median_ms"], 2),
         other_client_max_ms=round(trips["max_ms"], 2),
         other_client_idle_median_ms=round(idle["median_ms"], 2),
         other_client_idle_max_ms=round(idle["max_ms"], 2))
    log(f"{mib} MiB {name}: put {ours['put_s']:.2f} s (plain "
        f"{plain['put_s']:.2f}, ceiling {ceiling['put_s']:.2f}), get "
        f"{ours['get_s']:.2f} s (plain {plain['get_s']:.2f}, ceiling "
        f"{ceiling['get_s']:.2f}); another client's round trip meanwhile: "
        f"median {trips['median_ms']:.2f} ms, worst {trips['max_ms']:.2f} "
        "ms")


if __name__ == "__main__":
  main()
