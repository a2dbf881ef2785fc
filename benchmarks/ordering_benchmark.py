"""B7: adversarial ordering. Many clients, collectives over overlapping
device sets that span islands, issued without blocking in random
interleavings: 0 hangs and 0 wrong results through jax_pathways; the same
harness against per-worker FIFOs without gang order (benchmarks/naive_fifo.py)
shows what goes wrong without it.

    python benchmarks/ordering_benchmark.py [--clients 2 4 8] [--rounds 1000]
    python benchmarks/ordering_benchmark.py --naive --rounds 50

A cluster of 2 islands x 4 CPU devices (controller and workers started as
on real hosts, over loopback TCP); N client processes (ordering_client.py).
A round: every client is told "go" at once, issues --programs collectives
(psum, pmax, ppermute; random device set and data), then checks every result
exactly. A round that does not finish within --round-timeout is a hang; the
cluster is then restarted for the remaining rounds (at most --max-hangs
times). One JSON line per N.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import emit, log  # noqa: E402
from processes import Processes  # noqa: E402

ISLANDS, DEVICES = 2, 4


class Cluster:
  """The cluster and its N ordering clients."""

  def __init__(self, clients: int, naive: bool, programs: int):
    self.processes = Processes(
        ISLANDS, DEVICES,
        [sys.executable, os.path.join(HERE, "naive_fifo.py")] if naive
        else None)
    # One at a time: warm-ups (which check each program alone) never overlap.
    self.clients = [self.processes.client(
        "ordering_client.py", "--programs", str(programs), "--seed", str(k))
        for k in range(clients)]

  def round(self, timeout: float) -> list[dict]:
    """One round; TimeoutError if a client does not answer in time."""
    for c in self.clients:
      Processes.tell(c, "go")
    deadline = time.monotonic() + timeout
    return [self.processes.read(c, max(0.0, deadline - time.monotonic()))
            for c in self.clients]

  def close(self) -> None:
    self.processes.close()


def run(clients: int, rounds: int, args: argparse.Namespace) -> dict:
  totals = {"rounds": 0, "programs": 0, "wrong": 0, "hangs": 0, "errors": 0,
            "examples": []}
  start = time.monotonic()
  cluster = Cluster(clients, args.naive, args.programs)
  try:
    while totals["rounds"] < rounds:
      totals["rounds"] += 1
      try:
        answers = cluster.round(args.round_timeout)
      except (TimeoutError, RuntimeError) as e:
        totals["hangs"] += 1
        log(f"round {totals['rounds']}: hang ({type(e).__name__})")
        cluster.close()
        if totals["hangs"] >= args.max_hangs or totals["rounds"] >= rounds:
          break
        cluster = Cluster(clients, args.naive, args.programs)
        continue
      for a in answers:
        if "error" in a:
          totals["errors"] += 1
          totals["examples"].append(a["error"])
          continue
        totals["programs"] += a["programs"]
        totals["wrong"] += a["wrong"]
        if a["example"] and len(totals["examples"]) < 3:
          totals["examples"].append(a["example"])
  finally:
    cluster.close()
  totals["seconds"] = round(time.monotonic() - start, 1)
  return totals


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--clients", type=int, nargs="+", default=[2, 4, 8])
  parser.add_argument("--rounds", type=int, default=1000,
                      help="rounds per client count")
  parser.add_argument("--programs", type=int, default=6,
                      help="collectives per client per round")
  parser.add_argument("--naive", action="store_true",
                      help="per-worker FIFOs without gang order")
  parser.add_argument("--round-timeout", type=float, default=20.0)
  parser.add_argument("--max-hangs", type=int, default=3)
  args = parser.parse_args()
  mode = "naive per-worker FIFO" if args.naive else "jax_pathways"
  for n in args.clients:
    log(f"{mode}: {n} clients, {args.rounds} rounds")
    result = run(n, args.rounds, args)
    emit("B7 ordering", f"{mode}, {n} clients", mode=mode, clients=n,
         programs_per_round=args.programs, **result)


if __name__ == "__main__":
  main()
