"""B6: many clients on one device, proportional share.

    python benchmarks/share_benchmark.py [--seconds 3] [--weighted-seconds 10]
                                         [--weighted-only]

Programs of about 0.05, 0.3, 1 and 2.5 ms (tanh(x @ x), sizes calibrated on
in-process JAX here) on device 0, which every client shares, each client
keeping --in-flight calls in flight. 1, 2, 4 and 8 clients of weight 1:
aggregate throughput (calls/s in the window where all run) against one
in-process client doing the same; each client's share of the calls against
1/N. Then 4 clients of weights 1, 2, 4, 8 at once, for longer: shares
against w/15. Each run also gives each client's part of the device time
the controller's scheduler charged it (from `jax-pathways status`).
Share errors are given relative (max |share/wanted - 1|) and in points
(max |share - wanted| x 100).
The cluster is 2 islands x 4 devices over loopback TCP, as on real hosts.
"""
from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import emit, log  # noqa: E402
from processes import Processes  # noqa: E402

from jax_pathways import admin  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

# This process is the in-process reference only; the clients are processes.
jax.config.update("jax_platforms", "cpu")

TARGETS_MS = [0.05, 0.3, 1.0, 2.5]
CANDIDATES = [8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448,
              512, 640]


def calibrate() -> dict[float, tuple[int, float]]:
  """Target ms -> (size, measured ms) on one in-process CPU device."""
  step = jax.jit(lambda x: jnp.tanh(x @ x))
  device = jax.devices("cpu")[0]
  measured = {}
  for n in CANDIDATES:
    x = jax.device_put(np.ones((n, n), np.float32), device)
    step(x).block_until_ready()
    reps = 20
    t = time.perf_counter()
    out = None
    for _ in range(reps):
      out = step(x)
    out.block_until_ready()
    measured[n] = (time.perf_counter() - t) / reps * 1e3
  return {target: min(measured.items(),
                      key=lambda kv: abs(np.log(kv[1] / target)))
          for target in TARGETS_MS}


def in_process_rate(n: int, seconds: float, in_flight: int) -> float:
  step = jax.jit(lambda x: jnp.tanh(x @ x))
  x = jax.device_put(np.ones((n, n), np.float32) / n, jax.devices("cpu")[0])
  step(x).block_until_ready()
  pending: collections.deque = collections.deque()
  done, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    while len(pending) < in_flight:
      pending.append(step(x))
    pending.popleft().block_until_ready()
    done += 1
  return done / (time.perf_counter() - start)


def device_seconds(processes: Processes) -> dict[int, float]:
  """Device time the controller has charged each client (by number)."""
  status = admin.status(processes.address.removeprefix("grpc://"),
                        processes.token)
  return {c["client"]: c["device_seconds"] for c in status["clients"]}


class Client(NamedTuple):
  proc: subprocess.Popen
  number: int  # the client's number in the controller's status


def client(processes: Processes, *args: str) -> Client:
  """A share_client.py process (the one client that joins meanwhile)."""
  known = set(device_seconds(processes))
  proc = processes.client("share_client.py", *args)
  (number,) = set(device_seconds(processes)) - known
  return Client(proc, number)


def run(processes: Processes, clients: list[Client], n: int, seconds: float,
        in_flight: int) -> tuple[float, list[float], list[float]]:
  """All `clients` at once: (calls/s together, each one's part of the
  calls, each one's part of the device time the scheduler charged), calls
  counted in the window where every client was running, device time over
  the whole run."""
  before = device_seconds(processes)
  for c in clients:
    Processes.tell(c.proc, f"{n} {seconds} {in_flight}")
  times = [processes.read(c.proc, seconds + 120)["done"] for c in clients]
  after = device_seconds(processes)
  start = max(t[0] for t in times if t) + 0.2
  end = min(t[-1] for t in times if t) - 0.2
  counts = [sum(start <= x <= end for x in t) for t in times]
  charged = [after[c.number] - before[c.number] for c in clients]
  return (sum(counts) / max(end - start, 1e-9),
          [c / max(sum(counts), 1) for c in counts],
          [c / max(sum(charged), 1e-9) for c in charged])


def report(label: str, n: int, ms: float, weights: list[int], single: float,
           rate: float, shares: list[float],
           device_shares: list[float]) -> None:
  want = [w / sum(weights) for w in weights]
  emit("B6 share", label, program_ms=ms, size=n, clients=len(weights),
       weights=weights, calls_per_s=round(rate, 1),
       in_process_calls_per_s=round(single, 1),
       aggregate_vs_in_process=round(rate / single, 3),
       shares=[round(s, 3) for s in shares],
       device_time_shares=[round(s, 3) for s in device_shares],
       wanted=[round(w, 3) for w in want],
       max_share_error=round(max(abs(s / w - 1)
                                 for s, w in zip(shares, want)), 3),
       max_share_points=round(100 * max(abs(s - w)
                                        for s, w in zip(shares, want)), 1))


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--seconds", type=float, default=3.0)
  parser.add_argument("--weighted-seconds", type=float, default=10.0,
                      help="the 1:2:4:8 runs: the weight-1 client gets "
                      "1/15 of the calls, so it needs a longer window")
  parser.add_argument("--in-flight", type=int, default=16,
                      help="calls each client keeps in flight")
  parser.add_argument("--weighted-only", action="store_true",
                      help="skip the equal-weight runs")
  args = parser.parse_args()
  sizes = calibrate()
  log("sizes (target ms -> n, in-process ms):", sizes)
  size_list = ",".join(str(n) for n, _ in sizes.values())
  processes = Processes(islands=2, devices=4)
  try:
    equal = [client(processes, "--sizes", size_list)
             for _ in range(0 if args.weighted_only else 8)]
    weights = [1, 2, 4, 8]
    weighted = [client(processes, "--sizes", size_list, "--weight", str(w))
                for w in weights]
    for target, (n, ms) in sizes.items():
      single = in_process_rate(n, args.seconds, args.in_flight)
      for count in (1, 2, 4, 8) if equal else ():
        report(f"{target} ms x {count} clients", n, ms, [1] * count, single,
               *run(processes, equal[:count], n, args.seconds,
                    args.in_flight))
      report(f"{target} ms, weights 1:2:4:8", n, ms, weights, single,
             *run(processes, weighted, n, args.weighted_seconds,
                  args.in_flight))
  finally:
    processes.close()


if __name__ == "__main__":
  main()
