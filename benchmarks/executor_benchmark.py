"""The op channel alone: the controller's dispatcher to a worker's Executor.

    python benchmarks/executor_benchmark.py [--ops 20000] [--repeats 3]

No JAX and no devices: this process's C++ Dispatcher sends no-op launches
over a Unix socket pair to an Executor in a child process, whose loop (as
the worker's op loop, in Python) takes each op and reports it done at once.
It measures what the project's own transport costs per op, which B1 sees
only mixed with XLA's work and the client's, so there is no plain-JAX run to
compare with; compare builds instead, alternately, in one session.

  round trip  submit one op, wait for its completion (µs, median and p90):
              the wake-ups an op-by-op call pays on the worker's side
  paced       one op every --gap-us, as a chained loop sends them; CPU of
              the child per op, per thread (from /proc/self/task schedstat)
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import time
from typing import Any

from harness import emit  # pylint: disable=g-bad-import-order

from jax_pathways import _core  # noqa: E402

OpKind = _core.OpKind


def _thread_cpu_ns() -> dict[str, int]:
  out: dict[str, int] = {}
  for tid in os.listdir("/proc/self/task"):
    try:
      with open(f"/proc/self/task/{tid}/comm") as f:
        name = f.read().strip()
      with open(f"/proc/self/task/{tid}/schedstat") as f:
        ns = int(f.read().split()[0])
    except OSError:
      continue  # the thread ended meanwhile
    out[name] = out.get(name, 0) + ns
  return out


def _op_loop(fd: int, n: int, results: Any) -> None:
  """The worker's side: take ops as the op loop does, report each."""
  executor = _core.Executor(fd)
  seen, start = 0, None
  while seen < n:
    for op in executor.next_batch(1.0, 64):
      if start is None:
        start = _thread_cpu_ns()
      executor.complete(op.seq, 0, "", b"")
      seen += 1
  end = _thread_cpu_ns()
  results.put({name: round((ns - start.get(name, 0)) / (n - 1) / 1e3, 2)
               for name, ns in end.items() if ns > start.get(name, 0)})
  executor.shutdown()


def _run(n: int, gap_s: float | None) -> dict[str, Any]:
  """One child: `n` ops, each waited for (gap_s None) or paced."""
  ours, theirs = socket.socketpair()
  results = multiprocessing.Queue()
  child = multiprocessing.Process(target=_op_loop,
                                  args=(theirs.detach(), n, results))
  child.start()
  dispatcher = _core.Dispatcher(64)
  dispatcher.add_island(0, ours.detach(), "w0")
  trips = []
  done = 0
  due = time.perf_counter()
  for i in range(n):
    started = time.perf_counter()
    dispatcher.submit([(0, OpKind.LAUNCH, 7, [], [], b"")], i + 1)
    if gap_s is None:
      while not dispatcher.poll(1.0, 1):
        pass
      trips.append(time.perf_counter() - started)
      continue
    due += gap_s
    while time.perf_counter() < due:
      done += len(dispatcher.poll(0, 100))
  deadline = time.monotonic() + 30
  while gap_s is not None and done < n and time.monotonic() < deadline:
    done += len(dispatcher.poll(0.1, 100))
  cpu = results.get(timeout=30)
  child.join(timeout=30)
  dispatcher.shutdown()
  out: dict[str, Any] = {"child_cpu_us_per_op": cpu,
                         "child_cpu_us_total": round(sum(cpu.values()), 2)}
  if trips:
    trips.sort()
    out["round_trip_us_p50"] = round(trips[len(trips) // 2] * 1e6, 1)
    out["round_trip_us_p90"] = round(trips[len(trips) * 9 // 10] * 1e6, 1)
  return out


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--ops", type=int, default=20000)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--gap-us", type=float, default=150.0)
  args = parser.parse_args()
  for case, gap in (("round trip", None), ("paced", args.gap_us * 1e-6)):
    runs = [_run(args.ops, gap) for _ in range(args.repeats)]
    summary = {"child_cpu_us_total": statistics.median(
        r["child_cpu_us_total"] for r in runs)}
    if gap is None:
      summary["round_trip_us_p50"] = statistics.median(
          r["round_trip_us_p50"] for r in runs)
    emit("executor", case, ops=args.ops,
         gap_us=args.gap_us if gap else None, **summary, runs=runs)


if __name__ == "__main__":
  main()
