"""Schedule: the order in which each mesh runs its pipeline tasks, as data.

A task is the forward (F) or backward (B) of one stage for one microbatch;
zero-bubble schedules split a backward into its activation-gradient (Ba)
and weight-gradient (Bw) halves. `pipeline.schedule` is read back from the
partitioned program, so it is what the islands run, not what was asked for.
The textbook orders (`gpipe`, `one_f_one_b`) are here too, as the fallback
splitter's plan and as a reference, and `simulate` replays a schedule with
given task times: the bubble it costs with stages that are not equal.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

# What the user may ask for -> the partitioner's name for it.
SCHEDULES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "gpipebut1f1bforlastmesh": "GPipeBut1F1BForLastMesh",
    "circular": "Circular",
    "zerobubbleh1": "ZeroBubbleH1",
    "zerobubbleh2zerotxlatency": "ZeroBubbleH2ZeroTxLatency",
    "zerobubbleh2halftxlatency": "ZeroBubbleH2HalfTxLatency",
    "zerobubbleh2fulltxlatency": "ZeroBubbleH2FullTxLatency",
}
# Schedules that interleave several stages per mesh (stage ids required).
INTERLEAVED = {"Circular"}
# Schedules that need backward fragments split into Ba and Bw.
SPLIT_BACKWARD = {"ZeroBubbleH1", "ZeroBubbleH2ZeroTxLatency",
                  "ZeroBubbleH2HalfTxLatency", "ZeroBubbleH2FullTxLatency"}


def canonical(name: str) -> str:
  """The partitioner's spelling of a schedule; ValueError for unknown ones
  (the partitioner itself would abort the process)."""
  key = str(name).lower().replace("-", "").replace("_", "")
  if key not in SCHEDULES:
    raise ValueError(f"unknown pipeline schedule {name!r}; choose one of "
                     f"{sorted(set(SCHEDULES.values()))}")
  return SCHEDULES[key]


@dataclasses.dataclass(frozen=True)
class Task:
  kind: str             # F, B, Ba, Bw, R (rematerialized forward), or "?"
  microbatch: int | None
  stages: tuple[str, ...]

  def __str__(self) -> str:
    if self.microbatch is None:
      return f"[{'+'.join(self.stages)}]"
    return f"{self.kind}{self.microbatch}"


@dataclasses.dataclass(frozen=True)
class Schedule:
  """Per mesh, its tasks in the order it runs them."""
  name: str
  meshes: dict[str, tuple[Task, ...]]

  def order(self, mesh: str) -> list[str]:
    """The mesh's tasks as short labels, e.g. ['F0', 'F1', 'B0', ...];
    with the stage ('F0@s2') where the mesh runs several stages."""
    tasks = self.meshes[mesh]
    several = len({t.stages for t in tasks if t.microbatch is not None}) > 1
    return [f"{t}@{'+'.join(t.stages)}" if several and t.microbatch is not None
            else str(t) for t in tasks]

  def __str__(self) -> str:
    width = max(len(m) for m in self.meshes)
    rows = [f"{self.name} schedule"]
    rows += [f"  {m.ljust(width)}: {' '.join(self.order(m))}"
             for m in self.meshes]
    return "\n".join(rows)


def bubble_fraction(stages: int, microbatches: int) -> float:
  """Idle fraction of GPipe and 1F1B in theory, (S-1)/(M+S-1): equal
  stages and free moves (`simulate` drops the first assumption)."""
  return (stages - 1) / (microbatches + stages - 1)


def simulate(schedule: Schedule, stages: Sequence[str],
             durations: Mapping[str, Sequence[float]]) -> dict[str, float]:
  """Per mesh, its idle fraction when its i-th task takes durations[mesh][i]
  and moves between meshes take no time: the bubble the schedule itself
  costs with stages of these (possibly unequal) costs, which is what
  bubble_fraction assumes equal. `stages` lists the stages in pipeline
  order. Idle is 1 - busy / span, span from the first start to the last
  end of all meshes (as `Trace.utilization` measures it)."""
  order = {s: k for k, s in enumerate(stages)}
  for mesh, tasks in schedule.meshes.items():
    if len(durations.get(mesh, ())) != len(tasks):
      raise ValueError(f"mesh {mesh!r} runs {len(tasks)} tasks but "
                       f"{len(durations.get(mesh, ()))} durations were given")

  def made(task: Task) -> set[tuple[str, int | None, str]]:
    # F makes a stage's activations; B or Ba its input gradient.
    what = {"F": "F", "B": "grad", "Ba": "grad"}.get(task.kind)
    return {(what, task.microbatch, s) for s in task.stages} if what else set()

  def needs(task: Task) -> set[tuple[str, int | None, str]]:
    wanted = set()
    for s in task.stages:
      k = order[s]
      if task.kind == "F" and k > 0:
        wanted.add(("F", task.microbatch, stages[k - 1]))
      elif task.kind in ("B", "Ba"):
        wanted.add(("grad", task.microbatch, stages[k + 1])
                   if k + 1 < len(stages) else ("F", task.microbatch, s))
      elif task.kind == "Bw":
        wanted.add(("grad", task.microbatch, s))
    # Other tasks (rematerialization, unscheduled fragments) only wait for
    # their own mesh.
    return wanted - made(task)

  ends: dict[tuple[str, int | None, str], float] = {}
  clock = dict.fromkeys(schedule.meshes, 0.0)
  busy = dict.fromkeys(schedule.meshes, 0.0)
  next_task = dict.fromkeys(schedule.meshes, 0)
  remaining = sum(len(t) for t in schedule.meshes.values())
  while remaining:
    progressed = False
    for mesh, tasks in schedule.meshes.items():
      while next_task[mesh] < len(tasks):
        i = next_task[mesh]
        wanted = needs(tasks[i])
        if not wanted <= ends.keys():
          break
        start = max([clock[mesh]] + [ends[w] for w in wanted])
        clock[mesh] = start + durations[mesh][i]
        busy[mesh] += durations[mesh][i]
        ends.update(dict.fromkeys(made(tasks[i]), clock[mesh]))
        next_task[mesh] += 1
        remaining -= 1
        progressed = True
    if not progressed:
      stuck = {m: str(t[next_task[m]]) for m, t in schedule.meshes.items()
               if next_task[m] < len(t)}
      raise ValueError(f"schedule {schedule.name} never finishes: next tasks "
                       f"{stuck} wait for work no mesh runs before them")
  span = max(clock.values())
  return {m: 1.0 - busy[m] / span if span > 0 else 0.0
          for m in schedule.meshes}


def gpipe(meshes: Sequence[str], stages: Sequence[str],
          microbatches: int) -> Schedule:
  """All forwards, then all backwards, on every mesh (one stage a mesh)."""
  return Schedule("GPipe", {
      m: tuple([Task("F", i, (s,)) for i in range(microbatches)] +
               [Task("B", i, (s,)) for i in range(microbatches)])
      for m, s in zip(meshes, stages)})


def one_f_one_b(meshes: Sequence[str], stages: Sequence[str],
                microbatches: int) -> Schedule:
  """Mesh k warms up with S-k forwards, then alternates backward and
  forward, then drains its backwards (one stage a mesh)."""
  n = len(meshes)
  orders = {}
  for k, (m, s) in enumerate(zip(meshes, stages)):
    warmup = min(n - k, microbatches)
    tasks = [Task("F", i, (s,)) for i in range(warmup)]
    for b in range(microbatches):
      tasks.append(Task("B", b, (s,)))
      if warmup + b < microbatches:
        tasks.append(Task("F", warmup + b, (s,)))
    orders[m] = tuple(tasks)
  return Schedule("1F1B", orders)
