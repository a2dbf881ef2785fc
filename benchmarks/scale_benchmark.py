"""B10: the controller at scale, with simulated islands.

    python benchmarks/scale_benchmark.py [--islands 2,10,100,1000]
        [--clients 1,4,16,64] [--buffers 0,25000,50000,100000]
        [--calls 3000] [--figure docs/images/scale.svg]

The Pathways paper runs thousands of accelerators under one controller. Here
the islands are simulated (`jax-pathways worker --simulate N`: each island
has its own connection, heartbeat and gang order and answers every op at
once without computing), so that one machine holds a thousand of them and
what is measured is the controller alone: CPU per launch, from
/proc/PID/task/*/schedstat summed over its threads, less what it spends
idle in the same time (the islands' heartbeats, measured just before).

  islands   1 client, chained calls round robin over 8 islands spread over
            the cluster, for 2 .. 1000 islands of 1 device
  clients   1 .. 64 client processes, each chaining calls on an island of
            its own (as many islands as clients, at least 2)
  buffers   controller memory (RSS) against live arrays, 2 islands: one
            client keeps every result of its calls alive

Targets (issue 21): per launch flat, within 2x, from 2 to 1000 islands;
memory linear in live buffers. Ratios are against the smallest
configuration of the same run; in-process jax.jit per call of the same
program, in this process, is printed for scale.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import svg_chart  # pylint: disable=g-bad-import-order
from harness import CONTEXT, cpu_seconds, emit, log  # pylint: disable=g-bad-import-order
from processes import Processes  # pylint: disable=g-bad-import-order

# Islands per simulating process (each island: a C++ reader and heartbeat
# thread, and a Python thread).
SIMULATED_PER_PROCESS = 250
TARGETS = 8


def rss_mib(pid: int) -> float:
  with open(f"/proc/{pid}/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024
  raise RuntimeError(f"no VmRSS for {pid}")


class Cluster:
  """A controller, simulated islands and client processes."""

  def __init__(self, islands: int):
    self.processes = Processes(islands, devices=1,
                               simulate=SIMULATED_PER_PROCESS)
    self.pid = self.processes.controller_pid
    self.clients: list[Any] = []

  def add_clients(self, targets: list[list[int]]) -> None:
    for t in targets:
      self.clients.append(self.processes.client(
          "scale_client.py", "--targets", ",".join(map(str, t)),
          ready_timeout=600))

  def ask(self, line: str, clients: list[Any] | None = None
          ) -> list[dict[str, Any]]:
    clients = clients or self.clients
    for c in clients:
      Processes.tell(c, line)
    return [self.processes.read(c, 600) for c in clients]

  def idle_share(self, seconds: float = 2.0) -> float:
    """CPU seconds the idle controller spends per second."""
    before, start = cpu_seconds(self.pid), time.perf_counter()
    time.sleep(seconds)
    return (cpu_seconds(self.pid) - before) / (time.perf_counter() - start)

  def per_launch(self, calls: int, repeats: int) -> dict[str, float]:
    """Every client chains `calls` calls at once, `repeats` times: the
    controller's CPU per launch (idle subtracted), µs, and launches per
    second (medians)."""
    runs = []
    for _ in range(repeats):
      idle = self.idle_share()
      before, start = cpu_seconds(self.pid), time.perf_counter()
      self.ask(f"chain {calls}")
      wall = time.perf_counter() - start
      spent = cpu_seconds(self.pid) - before - idle * wall
      launches = calls * len(self.clients)
      runs.append((spent * 1e6 / launches, idle * 100, launches / wall))
    us, idle_percent, rate = (statistics.median(r[i] for r in runs)
                              for i in range(3))
    return {"controller_us_per_launch": us, "idle_cpu_percent": idle_percent,
            "launches_per_s": rate}

  def close(self) -> None:
    self.processes.close()


def in_process_us(calls: int) -> float:
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  # This process only measures; its clients (other processes) have the
  # cluster.
  jax.config.update("jax_platforms", "cpu")
  step = jax.jit(lambda x: x * 0.5 + 1.0)
  x = jax.device_put(np.zeros((4,), np.float32), jax.devices("cpu")[0])
  x = step(x).block_until_ready()
  start = time.perf_counter()
  for _ in range(calls):
    x = step(x)
  x.block_until_ready()
  return (time.perf_counter() - start) / calls * 1e6


def spread(islands: int, n: int) -> list[int]:
  """n islands spread evenly over 0..islands-1 (all if fewer)."""
  return sorted({round(i * (islands - 1) / max(n - 1, 1))
                 for i in range(min(n, islands))})


def sweep_islands(counts: list[int], calls: int, repeats: int
                  ) -> list[dict[str, Any]]:
  rows = []
  for islands in counts:
    cluster = Cluster(islands)
    try:
      started = time.perf_counter()
      cluster.add_clients([spread(islands, TARGETS)])
      joined_s = time.perf_counter() - started
      row = {"islands": islands, **cluster.per_launch(calls, repeats),
             "controller_rss_mib": rss_mib(cluster.pid),
             "threads": len(os.listdir(f"/proc/{cluster.pid}/task")),
             "cluster_up_and_client_ready_s": joined_s}
    finally:
      cluster.close()
    rows.append(row)
    log(json.dumps(row))
  return rows


def sweep_clients(counts: list[int], calls: int, repeats: int
                  ) -> list[dict[str, Any]]:
  rows = []
  for n in counts:
    cluster = Cluster(max(n, 2))
    try:
      cluster.add_clients([[i] for i in range(n)])
      row = {"clients": n,
             **cluster.per_launch(max(calls // n, 200), repeats),
             "controller_rss_mib": rss_mib(cluster.pid)}
    finally:
      cluster.close()
    rows.append(row)
    log(json.dumps(row))
  return rows


def sweep_buffers(counts: list[int]) -> list[dict[str, Any]]:
  rows = []
  cluster = Cluster(2)
  try:
    cluster.add_clients([[0]])
    client = cluster.clients
    live = 0
    for n in sorted(counts):
      if n > live:
        live = cluster.ask(f"keep {n - live}", client)[0]["live"]
      time.sleep(1)  # replies and DestructArrays of the warm-up settle
      rows.append({"live_buffers": live,
                   "controller_rss_mib": rss_mib(cluster.pid)})
      log(json.dumps(rows[-1]))
  finally:
    cluster.close()
  if len(rows) > 1:
    first, last = rows[0], rows[-1]
    per = ((last["controller_rss_mib"] - first["controller_rss_mib"]) *
           2**20 / max(last["live_buffers"] - first["live_buffers"], 1))
    for r in rows:
      r["bytes_per_buffer_overall"] = per
  return rows


def figure(islands: list[dict[str, Any]], clients: list[dict[str, Any]],
           buffers: list[dict[str, Any]]) -> str:
  rows = [(f"{r['islands']} islands, 1 client",
           r["controller_us_per_launch"], "CPU per launch, by islands")
          for r in islands]
  rows += [(f"{r['clients']} clients", r["controller_us_per_launch"],
            "CPU per launch, by clients") for r in clients]
  chart = svg_chart.bars(
      "B10: controller CPU per launch (µs), simulated islands", rows, "µs",
      log_scale=False)
  if not buffers:
    return chart
  memory = svg_chart.bars(
      "B10: controller memory (MiB) against live arrays",
      [(f"{r['live_buffers']:,} live arrays", r["controller_rss_mib"],
        "RSS") for r in buffers], "MiB", log_scale=False)
  return svg_chart.stack([chart, memory])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--islands", default="2,10,100,1000")
  parser.add_argument("--clients", default="1,4,16,64")
  parser.add_argument("--buffers", default="0,25000,50000,100000")
  parser.add_argument("--calls", type=int, default=3000,
                      help="calls per run, shared by the clients")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--figure", default=None,
                      help="write the SVG figure here")
  args = parser.parse_args()
  ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
  reference = in_process_us(args.calls)
  log(f"in-process jax.jit, same program: {reference:.1f} us per call")
  CONTEXT["devices"] = 1  # per island
  islands = sweep_islands(ints(args.islands), args.calls, args.repeats)
  clients = sweep_clients(ints(args.clients), args.calls, args.repeats)
  buffers = sweep_buffers(ints(args.buffers))
  for rows, key in ((islands, "islands"), (clients, "clients")):
    for r in rows:
      base = rows[0]["controller_us_per_launch"]
      emit("B10", f"{key}={r[key]}",
           ratio_to_smallest=r["controller_us_per_launch"] / base,
           in_process_jit_us=reference, **r)
  for r in buffers:
    emit("B10", f"buffers={r['live_buffers']}", **r)
  if args.figure:
    with open(args.figure, "w") as f:
      f.write(figure(islands, clients, buffers))
    log(f"figure: {args.figure}")


if __name__ == "__main__":
  main()
