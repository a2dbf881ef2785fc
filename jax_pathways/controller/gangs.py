"""Schedules: one launch as plain data.

A launch -- an Execute of a compiled program, or of an MPMD program of
several with the moves between their islands -- is a list of gangs of ops,
submitted in order, whose buffers are named by role: the Execute's argument
or result i, or a temporary the launch makes (and deletes with its own
DELETE ops). A move between islands gets a fresh transfer id per launch
(its ops' `program`; Dispatcher.new_transfers). Python runs a schedule
(Schedule.run), and the sessions' C++ fast path (csrc/controller/fast_path/fast_path.h)
runs the same one for the launches alike, so both submit the same ops.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any, NamedTuple, Sequence

from jax_pathways.controller.dispatcher import IslandOp, OnDone, OpKind
from jax_pathways.controller.launch_context import LaunchContext

# A buffer's role: (space, index).
ARG, RESULT, TEMP = 0, 1, 2
Ref = tuple[int, int]
_ids = itertools.count(1)


class PlannedOp(NamedTuple):
  """One island's op of a move (moves.py), but for the buffers and
  transfer id."""
  island: int
  kind: OpKind
  takes_source: bool  # the source buffer is its argument
  later: bool         # a receive the caller may submit when it is needed
  exchange: bool      # between islands: it takes the move's transfer id
  payload: bytes
  result_bytes: list[int]


class StepOp(NamedTuple):
  """One op of a schedule, its buffers by role."""
  island: int
  kind: OpKind
  program: int = 0
  args: tuple[Ref, ...] = ()
  results: tuple[Ref, ...] = ()
  payload: bytes = b""
  # Which move between islands of the launch (its transfer id is the op's
  # program); -1: none.
  move: int = -1
  # A move's op that does not take its source (a receive): it fails with
  # the source if that has failed by the time the op is numbered
  # (IslandOp.fails_with), instead of waiting for bytes that never come.
  fails_with_source: bool = False
  result_bytes: tuple[int, ...] = ()


@dataclasses.dataclass
class Schedule:
  """A launch: its gangs in order, the temporaries it makes, and the source
  of each of its moves between islands."""
  gangs: list[list[StepOp]]
  temps: int = 0
  move_sources: list[Ref] = dataclasses.field(default_factory=list)
  # The gang whose completion is the launch's (on_done); -1: the results'
  # readiness.
  done: int = -1
  # Schedules differ by id: the fast path takes more argument layouts for
  # a program only while its schedule is the same.
  id: int = dataclasses.field(default_factory=lambda: next(_ids))

  def run(self, context: LaunchContext, args: Sequence[int],
          results: Sequence[int], on_done: OnDone | None) -> None:
    """Submits the launch: `args` -> `results` (buffer ids)."""
    dispatcher = context.dispatcher
    temps = dispatcher.new_buffers(self.temps) if self.temps else []
    spaces = (args, results, temps)
    transfers = dispatcher.new_transfers(len(self.move_sources))
    for n, gang in enumerate(self.gangs):
      ops = []
      for op in gang:
        program, fails_with = op.program, 0
        if op.move >= 0:
          program = transfers[op.move]
          if op.fails_with_source:
            space, i = self.move_sources[op.move]
            fails_with = spaces[space][i]
        ops.append(IslandOp(op.island, op.kind, program,
                            [spaces[s][i] for s, i in op.args],
                            [spaces[s][i] for s, i in op.results],
                            payload=op.payload, result_bytes=op.result_bytes,
                            fails_with=fails_with))
      dispatcher.submit(ops, on_done if n == self.done else None)
    if temps:
      dispatcher.forget(temps)
    if on_done is not None and self.done < 0:
      dispatcher.when_ready(list(results), on_done)

  def add_move(self, planned: Sequence[PlannedOp], source: Ref,
               dest: Ref) -> tuple[list[StepOp], list[StepOp]]:
    """A move's ops (moves.planned), as (sends, receives to submit when
    the value is needed); its transfer id, if any, is this schedule's."""
    move = -1
    if any(p.exchange for p in planned):
      move = len(self.move_sources)
      self.move_sources.append(source)
    sends, later = [], []
    for p in planned:
      receive = p.kind in (OpKind.RECEIVE, OpKind.COPY)
      op = StepOp(p.island, p.kind,
                  args=(source,) if p.takes_source else (),
                  results=(dest,) if receive else (), payload=p.payload,
                  move=move if p.exchange else -1,
                  fails_with_source=p.exchange and not p.takes_source,
                  result_bytes=tuple(p.result_bytes))
      (later if p.later else sends).append(op)
    return sends, later

  def for_fast_path(self) -> tuple[Any, ...]:
    """The schedule as FastPath.register takes it."""
    def op(o: StepOp) -> tuple[Any, ...]:
      return (o.island, int(o.kind), o.program, list(o.args),
              list(o.results), o.payload, o.move, o.fails_with_source,
              list(o.result_bytes))
    return (self.id, self.temps, list(self.move_sources),
            [[op(o) for o in gang] for gang in self.gangs])
