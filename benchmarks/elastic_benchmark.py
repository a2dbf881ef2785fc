"""B8: elastic training through a lost worker: how long, and what is lost.

    python benchmarks/elastic_benchmark.py [--repeats 3] [--worker-timeout 5]
        [--compilation-cache DIR]

An MLP trains data parallel over a mesh of both islands (2 x 4 devices) with
jax_pathways.elastic, committing every 10 steps. Mid-run island 1's worker
is SIGKILLed ("kill") or SIGSTOPped ("hang"); the embedded cluster starts
a new worker, and the loop resumes from the last commit. Each fault is
measured on a fresh cluster (a child process of this one): the
supervisor backs off from workers that die again soon after a restart.
Per fault:

  detect     the fault (a kill) or the heartbeat deadline (a hang: the stop
             plus --worker-timeout) -> the step's DATA_LOSS reaches the loop
  restart    -> the island is up again (a new worker took its place)
  restore    -> the committed state is on the devices again
  recompile  -> the first step after it has finished (programs compiled
             again for the new worker, or loaded from the compilation
             cache with --compilation-cache)
  resumed    the fault -> training goes on (all of the above)
  steps lost committed steps lost (the final parameters are compared with
             an uninterrupted run of the same steps: equal means 0); steps
             after the last commit are run again and shown as "redone"

For scale, each time is also given in steps of plain in-process JAX on as
many CPU devices, measured in the same run.

With --state-mib N the state also holds N MiB made on the devices (sharded
over them; the steps pass it on), and each fault's run also reports what a
commit of it costs: `commit_s` (the median of three commits of the final
state, through the islands' workers) and `client_rss_mib` (the user's
process's peak RSS growth over the whole run, VmHWM reset before it).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import harness  # noqa: E402  (sets JAX_PLATFORMS before JAX starts)
from harness import emit, log  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_pathways  # noqa: E402
from jax_pathways import admin, elastic  # noqa: E402
from jax_pathways.elastic import commits  # noqa: E402

STEPS, COMMIT_EVERY, FAULT_AT = 60, 10, 25
WIDTH = 256
BALLAST = 0  # float32s of the state made on the devices (--state-mib)


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(step)
  x = rng.standard_normal((256, WIDTH)).astype(np.float32)
  return x, np.tanh(x[:, :1])


def setup(devices):
  mesh = Mesh(np.array(devices), ("data",))
  rows = NamedSharding(mesh, P("data"))

  @jax.jit
  def train(params, x, y):
    def loss_fn(p):
      return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"] - y) ** 2)
    weights = {k: params[k] for k in ("w1", "w2")}
    loss, grads = jax.value_and_grad(loss_fn)(weights)
    return dict(params, **jax.tree.map(lambda p, g: p - 0.05 * g, weights,
                                       grads)), loss

  def step(params, i):
    x, y = batch(i)
    return train(params, jax.device_put(x, rows), jax.device_put(y, rows))

  if BALLAST:
    return elastic.Plan({"w1": NamedSharding(mesh, P()),
                         "w2": NamedSharding(mesh, P()), "ballast": rows},
                        step)
  return elastic.Plan(NamedSharding(mesh, P()), step)


def initial_state(ballast: bool = True) -> dict[str, Any]:
  rng = np.random.default_rng(0)
  state = {
      "w1": rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) * 0.05,
      "w2": rng.standard_normal((WIDTH, 1)).astype(np.float32) * 0.05}
  if BALLAST and ballast:  # made where it lives, never in this process
    rows = NamedSharding(Mesh(np.array(jax.devices()), ("data",)),
                         P("data"))
    state["ballast"] = jax.jit(
        lambda: jnp.arange(BALLAST, dtype=jnp.float32) % 251,
        out_shardings=rows)()
  return state


def _status_bytes(field: str) -> int:
  with open("/proc/self/status", encoding="ascii") as f:
    line = next(l for l in f if l.startswith(field + ":"))
  return int(line.split()[1]) << 10


def plain_step_s(cpu_devices) -> float:
  """Seconds per step of the same training in process, same device count."""
  plan = setup(cpu_devices)
  weights = plan.state_sharding
  if isinstance(weights, dict):  # the ballast is the islands' alone
    weights = {k: weights[k] for k in ("w1", "w2")}
  state = jax.device_put(initial_state(ballast=False), weights)
  for i in range(3):  # compile, warm up
    state, loss = plan.step(state, i)
  jax.block_until_ready(state)
  start = time.perf_counter()
  for i in range(20):
    state, loss = plan.step(state, i)
  jax.block_until_ready(state)
  return (time.perf_counter() - start) / 20


def one_fault(kind: str, worker_timeout: float) -> dict[str, float]:
  address, token = jax_pathways.connection()
  fault: dict[str, float] = {}

  def on_step(step: int, _) -> None:
    if step == FAULT_AT and not fault:
      pid = admin.status(address, token)["islands"][1]["pid"]
      fault["at"] = time.monotonic()
      os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)

  start = initial_state()
  with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
    f.write("5")  # VmHWM starts again from the RSS now
  rss = _status_bytes("VmRSS")
  result = elastic.run(setup, start, STEPS,
                       commit_every=COMMIT_EVERY, rejoin_timeout=60.0,
                       on_step=on_step)
  grown = _status_bytes("VmHWM") - rss
  reference = elastic.run(setup, initial_state(), STEPS,
                          commit_every=COMMIT_EVERY)
  same = all(np.array_equal(a, b) for a, b in zip(
      jax.tree.leaves(jax.device_get(result.state)),
      jax.tree.leaves(jax.device_get(reference.state))))
  (e,) = [e for e in result.events if e.kind == "lost"]
  # A hang can only be seen once the heartbeat deadline has passed.
  deadline = fault["at"] + (worker_timeout if kind == "hang" else 0.0)
  extra = {}
  if BALLAST:
    with tempfile.TemporaryDirectory() as where:
      slots, times = commits.Slots(where), []
      for _ in range(3):
        begin = time.perf_counter()
        commits.take(result.state, STEPS, slots)
        times.append(time.perf_counter() - begin)
    extra = {"commit_s": statistics.median(times),
             "client_rss_mib": grown / (1 << 20)}
  return {**extra, "detect_s": e.detected_at - deadline,
          "restart_s": e.islands_at - e.detected_at,
          "restore_s": e.placed_at - e.islands_at,
          "recompile_s": e.resumed_at - e.placed_at,
          "resumed_s": e.resumed_at - fault["at"],
          "redone": float(e.steps_redone),
          "steps_lost": 0.0 if same else float("nan"),
          "islands": float(len(result.islands))}


def in_child(kind: str, worker_timeout: float) -> dict[str, float]:
  """one_fault() in a child process with a cluster of its own."""
  out = subprocess.run(
      [sys.executable, __file__, "--one", kind, "--worker-timeout",
       str(worker_timeout), "--state-mib", str(BALLAST >> 18)],
      capture_output=True, text=True, timeout=600, check=False)
  if out.returncode != 0:
    raise RuntimeError(f"the {kind} run failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--worker-timeout", type=float, default=5.0)
  parser.add_argument("--compilation-cache", default=None, metavar="DIR",
                      help="JAX's compilation cache directory for the "
                      "faults' runs: the workers keep compiled programs "
                      "there, and a new worker loads them")
  parser.add_argument("--one", choices=("kill", "hang"),
                      help="(internal) one fault, its times as JSON")
  parser.add_argument("--state-mib", type=int, default=0,
                      help="the state also holds this many MiB made on the "
                      "devices (commit costs reported)")
  parser.add_argument("--faults", nargs="+", default=["kill", "hang"],
                      choices=("kill", "hang"))
  args = parser.parse_args()
  global BALLAST
  BALLAST = args.state_mib << 18
  if args.compilation_cache:  # read by the children's JAX (in_child)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = args.compilation_cache
  _, cpu_devices = harness.setup(islands=2, devices_per_island=4,
                                 worker_timeout=args.worker_timeout)
  if args.one:
    print(json.dumps(one_fault(args.one, args.worker_timeout)), flush=True)
    return
  step_s = plain_step_s(cpu_devices)
  log(f"plain JAX: {step_s * 1e3:.2f} ms per step on {len(cpu_devices)} "
      "CPU devices")
  for kind in args.faults:
    runs = [in_child(kind, args.worker_timeout)
            for _ in range(args.repeats)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    emit("B8", kind, worker_timeout_s=args.worker_timeout,
         state_mib=args.state_mib,
         compilation_cache=bool(args.compilation_cache),
         plain_step_ms=round(step_s * 1e3, 3),
         resumed_in_plain_steps=round(med["resumed_s"] / step_s, 1),
         runs=[{k: round(v, 4) for k, v in r.items()} for r in runs],
         **{k: round(v, 4) for k, v in med.items()})
    log(f"{kind}: detect {med['detect_s']:.3f} s after the "
        f"{'fault' if kind == 'kill' else 'heartbeat deadline'}, restart "
        f"{med['restart_s']:.2f} s, restore {med['restore_s']:.3f} s, "
        f"recompile {med['recompile_s']:.2f} s; resumed "
        f"{med['resumed_s']:.2f} s after the fault "
        f"({med['resumed_s'] / step_s:.0f} plain-JAX steps); committed "
        f"steps lost {med['steps_lost']:.0f}, redone {med['redone']:.0f}; "
        f"on {med['islands']:.0f} islands" + (
            f"; a commit {med['commit_s']:.2f} s, the client's peak RSS "
            f"+{med['client_rss_mib']:.0f} MiB" if "commit_s" in med
            else ""))


if __name__ == "__main__":
  main()
