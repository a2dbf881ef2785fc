"""Shared set-up for benchmarks: both backends in one process, JSON lines.

Every benchmark compares jax_pathways with plain in-process JAX on the same
number of CPU devices, measured in the same run and interleaved (A, B, A, B,
...), because the machine is shared and absolute times drift. Import this
module before anything initializes JAX.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Sequence

# Both backends: 'proxy' (jax_pathways, the default) and 'cpu' (reference).
os.environ["JAX_PLATFORMS"] = "proxy,cpu"

import jax  # noqa: E402

import jax_pathways  # noqa: E402
from jax_pathways import config  # noqa: E402
from jax_pathways.cluster.local_cluster import LocalCluster  # noqa: E402

DEVICES = 4


def setup(islands: int = 1, devices_per_island: int = DEVICES,
          platform: str = "cpu", **cluster: Any
          ) -> tuple[list[Any], list[Any]]:
  """Starts the embedded cluster of `platform` islands (`cluster`: more
  initialize() options); returns (pathways devices, in-process devices):
  every island's devices and as many of this process's devices of that
  platform (the reference)."""
  n = islands * devices_per_island
  _local_backend(platform, n)
  if platform != "cpu":
    cluster["platform"] = platform
  jax_pathways.initialize(islands=islands,
                          devices_per_island=devices_per_island, **cluster)
  return jax.devices("proxy")[:n], jax.devices(platform)[:n]


def add_platform_args(parser: argparse.ArgumentParser) -> None:
  """--platform and --devices: the islands' devices and the reference's."""
  parser.add_argument("--platform", default="cpu",
                      help="the island's devices and the in-process "
                      "reference's, e.g. cuda (on a GPU host; with --devices "
                      "its GPU count)")
  parser.add_argument("--devices", type=int, default=DEVICES,
                      help="devices per island")


def _local_backend(platform: str, n: int) -> None:
  """This process's reference devices: `n` emulated CPU devices, or the
  host's devices of `platform` beside the cluster's."""
  if platform == "cpu":
    jax.config.update("jax_num_cpu_devices", n)
  else:
    jax.config.update("jax_platforms", f"proxy,{platform},cpu")
  CONTEXT.update(devices=n, platform=platform)


def _commit() -> str:
  try:
    return subprocess.check_output(
        ["git", "rev-parse", "--short", "HEAD"], text=True,
        cwd=os.path.dirname(os.path.abspath(__file__)),
        stderr=subprocess.DEVNULL).strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


CONTEXT = {
    "machine": platform.node(),
    "cpus": os.cpu_count(),
    "devices": DEVICES,
    "jax": jax.__version__,
    "commit": _commit(),
}


def emit(benchmark: str, case: str, **values: Any) -> None:
  """One JSON line per case on stdout."""
  print(json.dumps({"benchmark": benchmark, "case": case, **values,
                    **CONTEXT}), flush=True)


def interleaved(runs: dict[str, Callable[[], float]], repeats: int
                ) -> dict[str, float]:
  """Median of each run's result, the runs alternating `repeats` times."""
  results: dict[str, list[float]] = {name: [] for name in runs}
  for _ in range(repeats):
    for name, run in runs.items():
      results[name].append(run())
  return {name: statistics.median(v) for name, v in results.items()}


def one_island_processes(workers_over_tcp: bool = False,
                         platform: str = "cpu", devices: int = DEVICES
                         ) -> tuple[list[Any], list[Any], dict[str, int]]:
  """Starts an embedded cluster of one island (`devices` devices of
  `platform`) for host <-> device benchmarks; returns its devices, as many
  in-process devices of that platform, and the pids of this process (the
  client), the controller and the worker. `workers_over_tcp`: the worker
  connects over loopback TCP, as one on another host does (the controller
  sends it uploads' bytes)."""
  if workers_over_tcp:
    cluster = LocalCluster(1, devices, config.DEFAULT_MAX_IN_FLIGHT,
                           workers_over_tcp=True, platform=platform)
    cluster.start()
    atexit.register(cluster.stop)
    _local_backend(platform, devices)
    jax_pathways.initialize(cluster.address, token=cluster.token)
    pathways = jax.devices("proxy")[:devices]
    local = jax.devices(platform)[:devices]
  else:
    pathways, local = setup(islands=1, devices_per_island=devices,
                            platform=platform)
    cluster = jax_pathways.local_cluster()
  return pathways, local, {"client": os.getpid(),
                         "controller": cluster.controller.pid,
                         "worker": cluster.workers[0].pid}


def emit_host_transfer(benchmark: str, case: str, size: int,
                       ms: dict[str, float], baseline: str,
                       cpu_ms: dict[str, float], **values: Any) -> None:
  """One JSON line and a log line for a host <-> device case: median ms per
  way of moving `size` bytes ("pathways" first), GB/s and the ratio to
  `baseline`, and each process's CPU ms per transfer."""
  ratio = ms["pathways"] / ms[baseline]
  gbps = size / ms["pathways"] / 1e6
  emit(benchmark, case, bytes=size, **values,
       **{f"{k}_ms": round(v, 3) for k, v in ms.items()},
       pathways_gbps=round(gbps, 3), baseline=baseline,
       ratio=round(ratio, 2), cpu_ms_per_transfer=cpu_ms)
  log(f"{case:6s} {benchmark} " +
      "  ".join(f"{k} {v:.3f} ms" for k, v in ms.items()) +
      f"  ({gbps:.2f} GB/s, {ratio:.1f}x {baseline})  CPU ms {cpu_ms}")


def cpu_seconds(pid: int) -> float:
  """CPU time of process `pid`'s live threads so far (schedstat, ns
  precision: /proc/PID/stat counts 10 ms ticks, too coarse for one transfer;
  a thread that ended is not counted, and the processes measured keep
  theirs)."""
  return sum(thread_cpu_ns(pid).values()) / 1e9


def _per_thread(pid: int, file: str, parse: Callable[[str], int]
                ) -> dict[tuple[int, str], int]:
  """(tid, name) -> parse(/proc/PID/task/TID/<file>) for each thread of
  `pid` (one that ends meanwhile is left out). The main thread is named
  "main"."""
  out = {}
  for tid in os.listdir(f"/proc/{pid}/task"):
    try:
      with open(f"/proc/{pid}/task/{tid}/comm") as f:
        name = f.read().strip()
      with open(f"/proc/{pid}/task/{tid}/{file}") as f:
        value = parse(f.read())
    except OSError:  # the thread ended
      continue
    out[(int(tid), "main" if int(tid) == pid else name)] = value
  return out


def thread_cpu_ns(pid: int) -> dict[tuple[int, str], int]:
  """(tid, name) -> nanoseconds on a CPU so far, for each thread of `pid`
  (schedstat: ns precision, where /proc/PID/stat counts 10 ms ticks)."""
  return _per_thread(pid, "schedstat", lambda text: int(text.split()[0]))


def thread_wakeups(pid: int) -> dict[tuple[int, str], int]:
  """(tid, name) -> times the thread went to sleep and was woken so far
  (voluntary context switches), for each thread of `pid`."""
  return _per_thread(pid, "status", lambda text: int(
      text.split("voluntary_ctxt_switches:")[1].split()[0]))


# A per-thread counter for per_call: its reader, the divisor of what it
# counts, and the digits to round to.
Counter = tuple[Callable[[int], dict[tuple[int, str], int]], float, int]
CPU_US: Counter = (thread_cpu_ns, 1e3, 1)
WAKEUPS: Counter = (thread_wakeups, 1.0, 2)


def per_call(pids: dict[str, int], run: Callable[[], Any], calls: int,
             counters: Sequence[Counter]) -> list[dict[str, dict[str, float]]]:
  """Runs `run` (which makes `calls` calls) once and returns, for each of
  `counters`, per process of `pids`, the increase per call of each thread
  name (threads of one name summed; threads that started and ended inside
  are missed)."""
  before = [{k: read(pid) for k, pid in pids.items()}
            for read, _, _ in counters]
  run()
  results = []
  for (read, divisor, digits), start in zip(counters, before):
    out: dict[str, dict[str, float]] = {}
    for k, pid in pids.items():
      per_name: dict[str, float] = {}
      for (tid, name), n in read(pid).items():
        grew = n - start[k].get((tid, name), 0)
        per_name[name] = per_name.get(name, 0.0) + grew / divisor / calls
      out[k] = {n: round(v, digits) for n, v in
                sorted(per_name.items(), key=lambda kv: -kv[1])
                if v >= 0.05}
    results.append(out)
  return results


def cpu_per_call(pids: dict[str, int], run: Callable[[], Any], calls: int
                 ) -> dict[str, dict[str, float]]:
  """The CPU microseconds per call of each thread name (per_call)."""
  return per_call(pids, run, calls, [CPU_US])[0]


def timed(fn: Callable[[], Any]) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def log(*args: Any) -> None:
  print(*args, file=sys.stderr, flush=True)
