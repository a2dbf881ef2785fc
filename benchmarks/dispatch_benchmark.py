"""B1: dispatch cost, as in the Pathways paper's Figure 5.

    python benchmarks/dispatch_benchmark.py [--chain 128] [--repeats 5]
        [--platform cuda --devices 1]

The computation is a scalar psum + add over 4 devices (shard_map). Three ways
to run N of them, each through jax_pathways and in-process jax.jit on 4 CPU
devices, in the same run (--platform: an island of that platform's
--devices devices, against in-process JAX on the same devices):

  OpByOp   one call per computation, waiting for each result
  Chained  N calls issued without waiting, then one wait (in-process JAX
           needs a bounded window here: it hangs with ~64 collective
           launches in flight, so it blocks every 16 calls)
  Logged   Chained, reading one result back every 16 calls, as a training
           loop logs its loss (the read is a request the controller's
           Python answers; the calls queued behind it must come back to
           its C++ fast path)
  Fused    N computations in one program (fori_loop), one call

Prints one JSON line per case: microseconds per computation for both and the
ratio. Target (issue 2): Chained through jax_pathways costs no more per
computation than in-process OpByOp.

Then the CPU each chained call costs, per process and thread (from
/proc/PID/task/TID/schedstat over --profile-calls calls), and each op-by-op
call (a quarter as many: a round trip's CPU): what the project
owns is the controller's threads and the worker's own (its op loop, the
main thread, and the jp-* threads); the worker's other threads are XLA's
(tf_XLAEigen: the devices' compute; unnamed ones: jaxlib's). Issue 21's
target: <= 60 us owned per chained call, excluding XLA. The op loop's time
includes the PJRT Execute call itself (XLA's launch, which runs inline), so
the same run also measures that launch alone: the same program's executable
launched in this process on 4 CPU devices as the worker's op loop launches
it (execute_sharded with a token, outputs through a result handler), CPU of
the calling thread per launch. It prints owned both ways: all of the op
loop's time (an upper bound) and less that launch. And, from the same
calls, how often each thread went to sleep and was woken per call
(voluntary context switches): a call's path is a chain of such wake-ups.
"""
from __future__ import annotations

import argparse
import os
from typing import Callable

from harness import (CPU_US, WAKEUPS, add_platform_args, emit,  # pylint: disable=g-bad-import-order
                     interleaved, log, per_call, setup, thread_cpu_ns,  # pylint: disable=g-bad-import-order
                     timed)  # pylint: disable=g-bad-import-order

import jax  # noqa: E402
import jax_pathways  # noqa: E402
import numpy as np  # noqa: E402
from jax._src import core as jax_core  # noqa: E402
from jax._src.lib import xla_client as xc  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

IN_PROCESS_WINDOW = 16
# Logged: one result read back every this many calls.
LOG_EVERY = 16


def programs(devices):
  mesh = Mesh(np.array(devices), ("i",))
  step = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "i") * 0.25 + 1.0,
                               mesh=mesh, in_specs=P("i"), out_specs=P("i")))

  def fused_body(a):
    return jax.lax.fori_loop(
        0, fused_n, lambda i, c: jax.lax.psum(c, "i") * 0.25 + 1.0, a)

  fused_n = programs.chain
  fused = jax.jit(jax.shard_map(fused_body, mesh=mesh, in_specs=P("i"),
                                out_specs=P("i"), check_vma=False))
  # From the host: jnp.zeros would make it on the default (proxy) device,
  # which JAX cannot copy to a GPU's.
  x = jax.device_put(np.zeros((len(devices),), np.float32),
                     NamedSharding(mesh, P("i")))
  return step, fused, x


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--chain", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--profile-calls", type=int, default=2048)
  add_platform_args(parser)
  args = parser.parse_args()
  programs.chain = n = args.chain
  pathways_devices, local_devices = setup(devices_per_island=args.devices,
                                          platform=args.platform)
  state = {}
  for name, devices in (("pathways", pathways_devices),
                        ("jax", local_devices)):
    step, fused, x = programs(devices)
    jax.block_until_ready([step(x), fused(x)])  # compile and warm up
    state[name] = (step, fused, x)

  def waiting_every(name, k, wait):
    """Calls chained, `wait` on the result after every k-th."""
    step, _, x = state[name]
    def run():
      y = x
      for i in range(n):
        y = step(y)
        if i % k == k - 1:
          wait(y)
    return lambda: timed(run) / n

  def opbyop(name):
    return waiting_every(name, 1, lambda y: y.block_until_ready())

  def chained(name):
    step, _, x = state[name]
    window = n if name == "pathways" else IN_PROCESS_WINDOW
    def run():
      y, held = x, []
      for _ in range(n):
        y = step(y)
        held.append(y)
        if len(held) >= window:
          held.pop(0).block_until_ready()
      y.block_until_ready()
    return lambda: timed(run) / n

  def logged(name):  # a training loop reading its loss
    return waiting_every(name, LOG_EVERY, np.asarray)

  def fused(name):
    _, fused_fn, x = state[name]
    return lambda: timed(lambda: fused_fn(x).block_until_ready()) / n

  target = None
  for case, make in (("OpByOp", opbyop), ("Chained", chained),
                     ("Logged", logged), ("Fused", fused)):
    med = interleaved({"pathways": make("pathways"), "jax": make("jax")},
                      args.repeats)
    us = {k: v * 1e6 for k, v in med.items()}
    emit("B1 dispatch", case, pathways_us=round(us["pathways"], 1),
         jax_us=round(us["jax"], 1),
         ratio=round(us["pathways"] / us["jax"], 2), computations=n)
    log(f"{case:8s} jax_pathways {us['pathways']:8.1f} us   in-process "
        f"{us['jax']:8.1f} us   ratio {us['pathways'] / us['jax']:.2f}")
    if case == "OpByOp":
      target = us["jax"]
    if case == "Chained":
      met = us["pathways"] <= target
      emit("B1 dispatch", "target", chained_pathways_us=round(us["pathways"], 1),
           opbyop_jax_us=round(target, 1), met=met,
           miss_factor=round(us["pathways"] / target, 2))
      log(f"target: Chained through jax_pathways ({us['pathways']:.1f} us) <= "
          f"in-process OpByOp ({target:.1f} us): {'met' if met else 'missed'}")
  calls = args.profile_calls // n * n
  if not calls:  # --profile-calls 0: the timings alone
    return
  xla_launch = xla_launch_us(*state["jax"][::2], calls)
  profile("chained", chained("pathways"), calls, xla_launch)
  # Op by op, each call is a round trip: where its latency's CPU goes.
  profile("op-by-op", opbyop("pathways"), max(n, calls // 4 // n * n),
          xla_launch)


def owned_by_project(process: str, thread: str) -> bool:
  """Whether a thread's CPU is jax_pathways' (see the module docstring)."""
  return process == "controller" or thread == "main" or thread.startswith(
      "jp-")


def xla_launch_us(step, x, calls: int) -> float:
  """CPU of this thread per launch of `step`'s program (in-process devices)
  made as the worker's op loop makes it (pjrt_backend.execute): the part of
  the op loop's time that is XLA's, not the project's."""
  executable = step.lower(x).compile().runtime_executable()
  handler = xc.array_result_handler(jax_core.ShapedArray(x.shape, x.dtype),
                                    x.sharding, committed=True,
                                    _skip_checks=True)

  def run():
    y, held = x, []
    for _ in range(calls):
      results = executable.execute_sharded([y], with_tokens=True)
      held.append(results.consume_token())
      y = results.consume_with_handlers([handler])[0]
      if len(held) >= IN_PROCESS_WINDOW:  # as Chained in-process
        held.pop(0).block_until_ready()
    y.block_until_ready()

  run()  # warm up
  main = (os.getpid(), "main")
  before = thread_cpu_ns(os.getpid())[main]
  run()
  return (thread_cpu_ns(os.getpid())[main] - before) / 1e3 / calls


def profile(case: str, run: Callable[[], float], calls: int,
            xla_launch: float) -> None:
  """CPU and wake-ups per call of `case` (`run` makes programs.chain calls)
  by process and thread, and the project's share of the CPU (with and
  without XLA's launch inside the worker's op loop); the target is the
  chained call's."""
  cluster = jax_pathways.local_cluster()
  pids = {"client": os.getpid(), "controller": cluster.controller.pid,
          "worker": cluster.workers[0].pid}
  n = programs.chain
  per_thread, wakeups = per_call(
      pids, lambda: [run() for _ in range(calls // n)], calls,
      [CPU_US, WAKEUPS])
  totals = {p: round(sum(t.values()), 1) for p, t in per_thread.items()}
  owned = round(sum(us for p in ("controller", "worker")
                    for t, us in per_thread[p].items()
                    if owned_by_project(p, t)), 1)
  less_xla = round(owned - xla_launch, 1)
  target = {"target_us": 60, "met": less_xla <= 60} if case == "chained" else {}
  emit("B1 dispatch", f"cpu per {case} call", calls=calls, owned_us=owned,
       xla_launch_us=round(xla_launch, 1), owned_less_xla_launch_us=less_xla,
       **target, process_us=totals, thread_us=per_thread,
       thread_wakeups=wakeups)
  verdict = (f"; target <= 60: {'met' if target['met'] else 'missed'}"
             if target else "")
  log(f"CPU per {case} call over {calls} calls (us): owned by jax_pathways "
      f"{owned} with XLA's launch in the op loop, {less_xla} without it "
      f"(XLA's launch in process: {xla_launch:.1f}{verdict}); per process "
      f"{totals}")
  for p, threads in per_thread.items():
    log(f"  {p:10s} " + ", ".join(f"{t} {us}" for t, us in threads.items()))
  log(f"Wake-ups per {case} call (voluntary context switches):")
  for p, threads in wakeups.items():
    log(f"  {p:10s} " + ", ".join(f"{t} {w}" for t, w in threads.items()))


if __name__ == "__main__":
  main()
