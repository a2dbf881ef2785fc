"""B4: pipeline bubble, measured on the workers, against theory.

    python benchmarks/bubble_benchmark.py [--stages 2 4] [--microbatches 8]

A pipeline-parallel training step (an MLP, 2 layers of width x width per
stage, default 512, microbatches of --rows rows, default 128; stages of
equal work) over S islands of one device each, with GPipe and with 1F1B.
For each step, jax_pathways.trace() records every island's launches with
worker timestamps; an island's idle fraction is 1 - (its time in launches)
/ (the step's span from the first launch start to the last launch end),
which is what the textbook bubble (S-1)/(M+S-1) measures.

The textbook assumes every launch of a kind takes the same time. Next to it
the benchmark replays the schedule with the launch times this very step
measured and free moves (mpmd.schedule.simulate): what a runtime that
moved and issued for free would idle with these launches. Measured minus
that is what moves and issuing added; that minus the textbook is what
unequal launch times cost.

The same step is also run bare (bare_pipeline.py): its fragments, compiled
as the workers compile them, launched in schedule order by one plain
process per island on the same cores, with no controller, client, moves or
tracing. Its idle is this machine's floor for these fragments; B4's measured
idle minus it is everything the runtime adds.

The machine has 2 cores. Each island's device computes on one core (island
i on core i % 2: initialize(pin_islands=True); --no-pin leaves placement to
the OS); every other thread (the workers' op loops, completions and
transfers, the controller, the client) runs on either core. With S = 2
every stage has a core of its own for its launches; with S = 4 two stages
share each core, so launches that overlap in time take up to twice as long
(their time-sharing counts as busy).

Prints one JSON line per (S, schedule): measured idle fraction per island and
its mean, the theory, their relative difference, the replayed schedule's
idle, median launch times per kind and island (F0: forwards on island 0),
and the step time next to the same step as one jax.jit on one in-process
CPU device.
"""
from __future__ import annotations

import argparse
import statistics

from harness import emit, log, setup, timed  # pylint: disable=g-bad-import-order

import bare_pipeline  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_pathways  # noqa: E402
from jax_pathways import mpmd  # noqa: E402
from jax_pathways.tracing import Trace  # noqa: E402

LAYERS_PER_STAGE = 2


def model(stages: int, width: int):
  """The step, the same step as one plain jit, and parameters: per stage,
  LAYERS_PER_STAGE width x width layers; stage 0 first scales its input by
  a trained vector, so its backward computes its input gradient like every
  other stage (without it, it would skip 1 of 4 matmuls and the stages
  would not be equal, which the textbook bubble assumes)."""
  def make_stage(s):
    @mpmd.stage(f"s{s}")
    def run(p, h):
      return layers(p, h)
    return run

  def layers(p, h):
    if "gain" in p:
      h = h * p["gain"]
    for w in p["ws"]:
      h = jnp.tanh(h @ w)
    return h

  stage_fns = [make_stage(s) for s in range(stages)]

  def loss(params, batch):
    h, y = batch
    for s, fn in enumerate(stage_fns):
      h = fn(params[s], h)
    return jnp.mean((h - y) ** 2)

  def train_step(params, batch):
    value, grads = mpmd.value_and_grad(loss)(params, batch)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), value

  def plain_step(params, x, y, microbatches):
    def mean_loss(params):
      total = 0.0
      for xs, ys in zip(jnp.split(x, microbatches), jnp.split(y, microbatches)):
        h = xs
        for p in params:
          h = layers(p, h)
        total = total + jnp.mean((h - ys) ** 2)
      return total / microbatches
    value, grads = jax.value_and_grad(mean_loss)(params)
    return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), value

  rng = np.random.default_rng(0)
  params = [{"ws": [(rng.normal(size=(width, width)) / np.sqrt(width))
                    .astype(np.float32) for _ in range(LAYERS_PER_STAGE)]}
            for _ in range(stages)]
  params[0]["gain"] = np.ones(width, np.float32)
  return train_step, plain_step, params


def expected_idle(step: mpmd.Pipeline, trace: Trace,
                  stages: int) -> dict[int, float]:
  """Per island, the idle the schedule itself gives with the launch times
  this step measured, if moves and issuing took no time."""
  durations = {f"island{i}": [(op.ready_ns - op.start_ns) / 1e9
                              for op in trace.launches(i)]
               for i in range(stages)}
  idle = mpmd.schedule.simulate(step.schedule,
                                [f"s{k}" for k in range(stages)], durations)
  return {int(mesh.removeprefix("island")): v for mesh, v in idle.items()}


def by_kind(out: dict[str, list[float]], step: mpmd.Pipeline, island: int,
            seconds: list[float]) -> None:
  """Adds an island's launch times (in its schedule order) to `out`, in ms,
  keyed by task kind and island (F0: forwards on island 0)."""
  for t, task in zip(seconds, step.schedule.meshes[f"island{island}"]):
    out.setdefault(f"{task.kind}{island}", []).append(t * 1e3)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--stages", type=int, nargs="+", default=[2, 4])
  parser.add_argument("--microbatches", type=int, default=8)
  parser.add_argument("--steps", type=int, default=3, help="traced steps")
  parser.add_argument("--width", type=int, default=512,
                      help="layer width (2 width x width layers per stage)")
  parser.add_argument("--rows", type=int, default=128,
                      help="rows per microbatch")
  parser.add_argument("--no-pin", action="store_true",
                      help="let the OS place the workers")
  parser.add_argument("--pictures", default=None,
                      help="directory for a picture (.svg) of the last "
                      "traced step of each case")
  args = parser.parse_args()
  m = args.microbatches
  islands = max(args.stages)
  pathways, cpu = setup(islands=islands, devices_per_island=1,
                        pin_islands=not args.no_pin)
  log(f"island cores: {jax_pathways.local_cluster().device_cores}")
  rng = np.random.default_rng(1)
  x = rng.normal(size=(m * args.rows, args.width)).astype(np.float32)
  y = rng.normal(size=(m * args.rows, args.width)).astype(np.float32)
  for s in args.stages:
    train_step, plain_step, params = model(s, args.width)
    plain = jax.jit(plain_step, static_argnums=3)
    local = jax.device_put((params, x, y), cpu[0])
    plain(*local, m)[1].block_until_ready()
    plain_s = statistics.median(
        timed(lambda: plain(*local, m)[1].block_until_ready())
        for _ in range(3))
    for schedule in ("GPipe", "1F1B"):
      step = mpmd.pipeline(train_step, mpmd.Topology.islands(list(range(s))),
                           stages={f"s{k}": k for k in range(s)},
                           schedule=schedule, microbatches=m,
                           batch_argnums=(1,))
      batch = (x, y)
      p = params
      for _ in range(2):  # compile, warm up
        p, loss = step(p, batch)
      loss.block_until_ready()
      idle: dict[int, list[float]] = {i: [] for i in range(s)}
      expected: dict[int, list[float]] = {i: [] for i in range(s)}
      launch_ms: dict[str, list[float]] = {}
      step_s = []
      for _ in range(args.steps):
        with jax_pathways.trace() as t:
          step_s.append(timed(lambda: step(p, batch)[1].block_until_ready()))
        for island, used in t.utilization().items():
          idle[island].append(1.0 - used)
        for island, v in expected_idle(step, t, s).items():
          expected[island].append(v)
        for i in range(s):
          by_kind(launch_ms, step, i, [(op.ready_ns - op.start_ns) / 1e9
                                       for op in t.launches(i)])
      bare, bare_launch_s = bare_pipeline.measure(
          step.ifrt_ir, islands=s, steps=args.steps, pin=not args.no_pin)
      bare_launch_ms: dict[str, list[float]] = {}
      for i, per_step in bare_launch_s.items():
        for seconds in per_step:
          by_kind(bare_launch_ms, step, i, seconds)
      bare_per_island = {i: round(statistics.median(v), 4)
                         for i, v in bare.items()}
      bare_mean = statistics.mean(bare_per_island.values())
      if args.pictures:
        t.save(f"{args.pictures}/pipeline_{schedule.lower()}_{s}_islands_"
               f"{args.width}.svg")
      per_island = {i: round(statistics.median(v), 4) for i, v in idle.items()}
      mean = statistics.mean(per_island.values())
      schedule_idle = statistics.mean(statistics.median(v)
                                      for v in expected.values())
      theory = mpmd.bubble_fraction(s, m)
      emit("B4 bubble", f"S={s} {schedule}", stages=s, microbatches=m,
           width=args.width, rows=args.rows,
           schedule=schedule, idle_per_island=per_island,
           idle_mean=round(mean, 4), theory=round(theory, 4),
           relative_difference=round((mean - theory) / theory, 3),
           within_10_percent=abs(mean - theory) <= 0.1 * theory,
           schedule_idle_with_measured_launches=round(schedule_idle, 4),
           added_by_moves_and_issue=round(mean - schedule_idle, 4),
           bare_idle_per_island=bare_per_island,
           bare_idle=round(bare_mean, 4),
           added_by_runtime=round(mean - bare_mean, 4),
           bare_launch_ms_median={k: round(statistics.median(v), 1)
                                  for k, v in sorted(bare_launch_ms.items())},
           launch_ms_median={k: round(statistics.median(v), 1)
                             for k, v in sorted(launch_ms.items())},
           step_ms=round(statistics.median(step_s) * 1e3, 1),
           plain_jit_one_device_ms=round(plain_s * 1e3, 1),
           speedup_vs_one_device=round(plain_s / statistics.median(step_s),
                                       2))
      log(f"S={s} {schedule:5s} idle {mean:.3f} (per island {per_island}) "
          f"theory {theory:.3f} (schedule with these launch times "
          f"{schedule_idle:.3f}, bare {bare_mean:.3f})  step {statistics.median(step_s) * 1e3:.0f} ms"
          f" vs one device {plain_s * 1e3:.0f} ms")


if __name__ == "__main__":
  main()
