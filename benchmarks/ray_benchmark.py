"""B9: jax_pathways and Ray side by side, on this machine, in one run.

    python benchmarks/ray_benchmark.py [--calls 500] [--repeats 5]
        [--figure docs/images/ray_side_by_side.svg]

Round trips, one at a time (call, then wait for the result):
  trivial   jax_pathways: a jitted x + 1 on a float32 scalar on island 0;
            in-process JAX: the same on a CPU device; Ray: an actor method
            echoing its argument (Ray's own echo micro-benchmark), as a
            task call and through a compiled graph (ray.dag, compiled once).
  4 KB      a float32[1024] made on one side and consumed on the other:
            jax_pathways: made by a program on island 0, moved to island 1
            (jax.device_put), summed there; in-process JAX: the same
            between two CPU devices; Ray: actor A returns the array, actor B
            sums it (task calls; compiled graph).
The Ray cluster is local (ray.init, 2 CPUs), its actors in their own
processes as jax_pathways' workers are; both run throughout, measured in
turn, repeat by repeat; the compiled graphs after the rest (their actors
poll their channels, which would slow everything else on 2 cores). Prints one JSON line per case and a table of
microseconds per round trip with ratios to in-process JAX.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, Callable

from harness import emit, log, setup  # pylint: disable=g-bad-import-order

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import ray  # noqa: E402
from ray import dag as ray_dag  # noqa: E402

import svg_chart  # noqa: E402

SIZE = 1024  # float32: 4 KB


@ray.remote(num_cpus=0)
class _Echo:
  def echo(self, x: Any) -> Any:
    return x

  def make(self, x: Any) -> np.ndarray:
    return np.full(SIZE, x, np.float32)

  def total(self, a: np.ndarray) -> float:
    return float(a.sum())


def _jax_cases(devices: list[Any]) -> dict[str, Callable[[], Any]]:
  """Round trips on two devices (two islands for jax_pathways)."""
  add = jax.jit(lambda x: x + 1.0)
  make = jax.jit(lambda x: jnp.full((SIZE,), x, jnp.float32))
  total = jax.jit(jnp.sum)
  scalar = jax.device_put(jnp.float32(0), devices[0])
  jax.block_until_ready([add(scalar), total(jax.device_put(
      make(scalar), devices[1]))])  # compile and warm up

  def handoff() -> None:
    total(jax.device_put(make(scalar), devices[1])).block_until_ready()

  return {"trivial": lambda: add(scalar).block_until_ready(),
          "4 KB": handoff}


def _ray_cases() -> dict[str, Callable[[], Any]]:
  a, b = _Echo.remote(), _Echo.remote()
  ray.get([a.echo.remote(0), b.echo.remote(0)])
  return {"trivial": lambda: ray.get(a.echo.remote(1.0)),
          "4 KB": lambda: ray.get(b.total.remote(a.make.remote(1.0)))}


def _compiled_graphs() -> tuple[dict[str, Any], str]:
  """Ray's compiled graphs of the same round trips (ray.dag), or why they
  cannot run here."""
  graphs: dict[str, Any] = {}
  try:
    # An actor takes part in one compiled graph at a time: fresh ones.
    c, d, e = _Echo.remote(), _Echo.remote(), _Echo.remote()
    with ray_dag.InputNode() as x:
      echo = c.echo.bind(x)
    with ray_dag.InputNode() as x:
      handoff = e.total.bind(d.make.bind(x))
    for name, graph in (("trivial", echo), ("4 KB", handoff)):
      graphs[name] = graph.experimental_compile()
      ray.get(graphs[name].execute(1.0))
  except Exception as e:  # pylint: disable=broad-except
    why = f"{type(e).__name__}: {e}"[:300]
    log(f"Ray compiled graphs did not run here: {why}")
    return graphs, why
  return graphs, ""


def _measure(runs: dict[Any, Callable[[], Any]], calls: int, repeats: int
             ) -> dict[Any, float]:
  """Median microseconds per call of each run, the runs taking turns."""
  samples: dict[Any, list[float]] = {k: [] for k in runs}
  for _ in range(repeats):
    for key, fn in runs.items():
      samples[key].append(_per_call_us(fn, calls))
  return {k: statistics.median(v) for k, v in samples.items()}


def _per_call_us(fn: Callable[[], Any], calls: int) -> float:
  start = time.perf_counter()
  for _ in range(calls):
    fn()
  return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--calls", type=int, default=500)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--figure", default="",
                      help="write a bar chart (.svg) here")
  args = parser.parse_args()
  pathways, cpu = setup(islands=2, devices_per_island=1)
  ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
           object_store_memory=100 * 2**20, configure_logging=False)
  graphs: dict[str, Any] = {}
  try:
    runs = {("jax_pathways", k): v for k, v in _jax_cases(pathways).items()}
    runs.update({("in-process JAX", k): v
                 for k, v in _jax_cases(cpu).items()})
    runs.update({("Ray", k): v for k, v in _ray_cases().items()})
    us = _measure(runs, args.calls, args.repeats)
    # Apart: a compiled graph's actors poll their channels, taking CPU from
    # whatever else runs on these 2 cores.
    graphs, why = _compiled_graphs()
    us.update(_measure({("Ray", f"{k}, compiled graph"):
                        lambda g=g: ray.get(g.execute(1.0))
                        for k, g in graphs.items()},
                       args.calls, args.repeats))
  finally:
    for graph in graphs.values():
      graph.teardown()
    ray.shutdown()
  rows = []
  for (system, case), value in us.items():
    base = us[("in-process JAX", case.split(",")[0])]
    emit("B9 side by side with Ray", f"{system}: {case}",
         us_per_round_trip=round(value, 1),
         vs_in_process_jax=round(value / base, 2), calls=args.calls,
         repeats=args.repeats, ray=ray.__version__,
         **({"compiled_graph_error": why} if why and system == "Ray" else {}))
    log(f"{system:15s} {case:24s} {value:9.1f} us  "
        f"({value / base:6.1f}x in-process JAX)")
    rows.append((f"{system}: {case}", value, system))
  if args.figure:
    os.makedirs(os.path.dirname(args.figure) or ".", exist_ok=True)
    with open(args.figure, "w") as f:
      f.write(svg_chart.bars(
          "Round trip, one at a time (lower is better)",
          sorted(rows, key=lambda r: (r[0].split(": ")[1], r[1])), "us"))


if __name__ == "__main__":
  main()
