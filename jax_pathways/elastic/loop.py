"""run(): a training loop that survives losing islands, no committed step lost.

    def setup(devices):              # at the start and after every change
      mesh = Mesh(np.array(devices), ("data",))
      batch = NamedSharding(mesh, P("data"))
      def step(state, i):            # step i -> (state, metrics)
        return train_step(state, jax.device_put(batches(i), batch))
      return elastic.Plan(NamedSharding(mesh, P()), step)

    result = elastic.run(setup, state, steps=1000, commit_every=10)

Every `commit_every` steps the state is committed (commits.py): saved by the
islands' workers into `commit_dir` (by default, on the embedded cluster, a
directory of its own under the workers' storage root), costing this
process nothing; without one (a remote cluster and no `commit_dir`), copied
into this process's memory. When a step fails because an island was lost
(DATA_LOSS: its worker died or stopped answering), the loop waits up to
`rejoin_timeout` for the island to be back (a new worker took its place),
otherwise goes on with the islands that are up; either way it calls
`setup` again with the devices it now has, places the last commit there
(resharded if the mesh shrank) and
resumes from the committed step. Steps after the commit are run again, from
the same state and step index, so nothing committed is lost and a step the
user's code makes deterministic gives the same bits as a run without loss.
Once lost islands are back the loop grows again at the next commit.
"""
from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from typing import Any, Callable, Sequence

import jax
from absl import logging

from jax_pathways import _initialize
from jax_pathways.elastic import commits
from jax_pathways.elastic import islands as islands_lib

# A step: (state, step index) -> (state, metrics).
Step = Callable[[Any, int], "tuple[Any, Any]"]


@dataclasses.dataclass(frozen=True)
class Plan:
  """How to train on a set of devices: where the state lives (a Sharding,
  or a pytree of them matching a prefix of the state) and one step."""
  state_sharding: Any
  step: Step


@dataclasses.dataclass(frozen=True)
class Event:
  """A change of islands and what the loop did (times: time.monotonic()).

  kind "lost": a step failed with `error`; "grew": lost islands were back
  at a commit. The loop went on from `resumed_step` on `islands` (a loss
  that came before the loop had resumed from the one before is an event
  of its own, whose resumed_at is 0: the loop never resumed from it)."""
  kind: str
  error: str
  lost: tuple[int, ...]      # islands down when the loss was seen
  failed_step: int           # steps the loop had issued when it saw it
  resumed_step: int          # the committed step it went on from
  islands: tuple[int, ...]   # islands it went on with
  detected_at: float
  islands_at: float          # knew which islands to go on with
  placed_at: float           # the commit was on the devices again
  resumed_at: float          # first step after it finished (compile too)
  # For islands it went on without whose supervisor gave up restarting
  # their worker: why, and what to do ("island N: ..." lines).
  given_up: str = ""

  @property
  def steps_redone(self) -> int:
    """Steps issued after the last commit, run again."""
    return self.failed_step - self.resumed_step


@dataclasses.dataclass(frozen=True)
class Result:
  state: Any                 # the final state, on `islands`' devices
  step: int
  islands: tuple[int, ...]
  events: tuple[Event, ...]


class IslandsLost(RuntimeError):
  """Too few islands came back to go on."""


def is_loss(error: BaseException) -> bool:
  """Whether `error` says an island was lost (what the controller reports
  for a dead or silent worker, as pathwaysutils reads it too)."""
  return (isinstance(error, jax.errors.JaxRuntimeError) and
          "DATA_LOSS" in str(error))


def run(setup: Callable[[Sequence[jax.Device]], Plan], state: Any,
        steps: int, *, start_step: int = 0, commit_every: int = 1,
        islands: Sequence[int] | None = None, rejoin_timeout: float = 10.0,
        min_islands: int = 1, give_up_after: float = 300.0,
        max_losses: int | None = None, grow: bool = True,
        on_step: Callable[[int, Any], None] | None = None,
        on_event: Callable[[Event], None] | None = None,
        commit_dir: str | None = None) -> Result:
  """Runs steps `start_step` .. `steps` - 1 of `state` on `islands` (all
  by default), surviving losses.

  Args:
    setup: devices -> Plan; called at the start and after every change of
      islands, with the devices of the islands in use.
    state: the initial train state (a pytree; on device or host).
    steps: the step count to reach.
    commit_every: copy the state to this process every this many steps
      (and after the last).
    rejoin_timeout: seconds to wait for lost islands to be back before
      going on without them.
    min_islands: never go on with fewer; wait for them up to
      `give_up_after` seconds, then raise IslandsLost.
    max_losses: raise the loss error after this many losses.
    grow: at commits, take back islands that were lost and are up again.
    on_step: called with (steps done, metrics) after every step; it may
      read the metrics (a loss read there is handled as any other).
    on_event: called with each Event once the loop has resumed.
    commit_dir: where the islands' workers save commits (a directory under
      their storage root, which every worker sees; two slots in it are
      written in turn). Default: on the embedded cluster, a directory of
      its own under its storage root, removed at the end; on a remote
      cluster, none: commits are copied into this process's memory.
  """
  if commit_every < 1 or min_islands < 1:
    raise ValueError(f"commit_every={commit_every} and min_islands="
                     f"{min_islands} must be at least 1")
  wanted = tuple(islands) if islands is not None else (
      islands_lib.all_islands())
  if len(wanted) < min_islands:
    raise ValueError(f"min_islands={min_islands} but only islands {wanted} "
                     "are asked for")
  made = None
  cluster = _initialize.local_cluster()
  if commit_dir is None and cluster is not None:
    root = cluster.storage_root
    made = commit_dir = tempfile.mkdtemp(
        prefix="jax_pathways_commits_",
        dir=None if root in (None, "/") else root)
  try:
    return _run(setup, state, steps, start_step, commit_every, wanted,
                rejoin_timeout, min_islands, give_up_after, max_losses, grow,
                on_step, on_event,
                commits.Slots(commit_dir) if commit_dir else None)
  finally:
    if made is not None:
      shutil.rmtree(made, ignore_errors=True)


def _run(setup: Callable[[Sequence[jax.Device]], Plan], state: Any,
         steps: int, start_step: int, commit_every: int,
         wanted: tuple[int, ...], rejoin_timeout: float, min_islands: int,
         give_up_after: float, max_losses: int | None, grow: bool,
         on_step: Callable[[int, Any], None] | None,
         on_event: Callable[[Event], None] | None,
         slots: commits.Slots | None) -> Result:
  """run(), its arguments checked, committing to `slots` (None: to this
  process's memory)."""
  using = wanted
  commit = commits.take(state, start_step, slots)
  events: list[Event] = []
  losses = 0
  pending: Event | None = None  # a change not yet resumed from
  step = commit.step
  while True:
    try:
      plan = setup(islands_lib.devices(using))
      state = commits.place(commit, plan.state_sharding)
      step = commit.step
      if pending is not None:
        pending = dataclasses.replace(pending, placed_at=time.monotonic())
      while step < steps:
        state, metrics = plan.step(state, step)
        step += 1
        if pending is not None:  # how long the first step took: compiles
          jax.block_until_ready(state)
          events.append(dataclasses.replace(pending,
                                            resumed_at=time.monotonic()))
          pending = None
          logging.info("elastic: resumed at step %d on islands %s",
                       events[-1].resumed_step, list(using))
          if on_event is not None:
            on_event(events[-1])
        if on_step is not None:
          on_step(step, metrics)
        if step % commit_every == 0 or step == steps:
          commit = commits.take(state, step, slots)
          if grow and using != wanted:
            back = islands_lib.up()
            if len(back.intersection(wanted)) > len(using):
              now = time.monotonic()
              using = tuple(i for i in wanted if i in back)
              logging.info("elastic: islands %s are up again; growing to "
                           "%s at step %d", sorted(back), list(using), step)
              pending = Event("grew", "", (), step, step, using, now, now,
                              now, now)
              break
      else:
        return Result(state, step, using, tuple(events))
    except jax.errors.JaxRuntimeError as e:
      if not is_loss(e):
        raise
      losses += 1
      if max_losses is not None and losses > max_losses:
        raise
      detected = time.monotonic()
      up = islands_lib.up()
      if up.issuperset(using):  # perhaps not seen by the controller yet
        up = islands_lib.wait(lambda now: not now.issuperset(using),
                              islands_lib.NOTICE_S)
      lost = tuple(i for i in using if i not in up)
      if not lost and pending is not None:
        # Failed again before a step went through, with every island up:
        # going on again would fail the same way.
        raise
      logging.warning("elastic: lost islands %s at step %d (%s); going on "
                      "from committed step %d", list(lost), step,
                      str(e).splitlines()[0], commit.step)
      if pending is not None:
        # A loss before the last one was resumed from: its own event, never
        # resumed (resumed_at 0), before this one's.
        events.append(pending)
        if on_event is not None:
          on_event(pending)
      using = _islands_to_use(wanted, rejoin_timeout, min_islands,
                              give_up_after)
      gone = islands_lib.given_up(i for i in wanted if i not in using)
      if gone:
        logging.error("elastic: going on without islands whose worker is "
                      "not restarted any more; training grows back onto "
                      "them at a commit once they are up again:\n%s", gone)
      pending = Event("lost", str(e), lost, step, commit.step, using,
                      detected, time.monotonic(), 0.0, 0.0, gone)
      state = None  # its arrays are failed: let them go before placing anew


def _islands_to_use(wanted: Sequence[int], rejoin_timeout: float,
                    min_islands: int, give_up_after: float
                    ) -> tuple[int, ...]:
  """`wanted` once all are up, or after `rejoin_timeout` those that are (at
  least `min_islands`, waiting up to `give_up_after` for them)."""
  up = islands_lib.wait(lambda up: set(wanted) <= up, rejoin_timeout)
  if len(up.intersection(wanted)) < min_islands:
    up = islands_lib.wait(lambda up: len(up.intersection(wanted)) >=
                          min_islands, give_up_after)
  usable = tuple(i for i in wanted if i in up)
  if len(usable) < min_islands:
    raise IslandsLost(
        f"only islands {list(usable)} of {list(wanted)} are up after "
        f"{rejoin_timeout + give_up_after:.0f} s, fewer than min_islands="
        f"{min_islands}: start workers for the others (jax-pathways worker "
        "--island N) or lower min_islands")
  return usable
