"""trace(): what each island ran, and when, as a Chrome trace.

    with jax_pathways.trace("/tmp/step.json") as t:
      train_step(...)
    print(t.utilization())     # per island: time in launches / step span

Open the file in chrome://tracing or https://ui.perfetto.dev: one row per
island, one box per op. Workers record when they issued each op, when its
results were ready, and which earlier ops made its inputs. A launch counts
as running from the later of its issue and the end of the ops it reads
from (before that it waits for its turn, not running) until it was ready;
time spent waiting for data shows on the receive that waited. An island
can run independent programs side by side (XLA:CPU does): a launch that
overlaps another of its island goes on a line of its own (`lane`), so no
line shows two at once, and utilization counts the time any launch ran.
Records of workers that do not name inputs are read as launches one after
another.

A worker learns that an op is done on one thread, in op order, so it notices
a receive only after reporting the launch before it: on a core busy with the
next launch that takes 0.5-4 ms. A receive already done by then counts as
arrived by the end of that launch (its bytes were there; the device went
straight on, as a pulled input behind a launch costs it ~0.02 ms), not when
the worker noticed, which would add a false wait per move. A receive the
worker had to wait for counts from when it was done.

start() and stop() are trace()'s two halves, which profile() (profiling.py)
puts inside a jax.profiler trace.
"""
from __future__ import annotations

import contextlib
import json
import time
from typing import Any, Iterator, NamedTuple

from jax_pathways import _initialize
from jax_pathways import admin


class OpTiming(NamedTuple):
  island: int
  seq: int
  kind: str        # launch, put, fetch, send, receive, copy, ...
  name: str        # the program's name for launches
  issued_ns: int   # the worker's op loop took it
  issue_end_ns: int  # ... and handed it on (to PJRT, a peer, ...)
  start_ns: int    # running (or waiting for its data) from here
  ready_ns: int    # its results were ready
  lane: int = 0    # its island's line: launches running at once differ


class Trace:
  """The ops recorded between entering and leaving trace()."""

  def __init__(self):
    self.ops: list[OpTiming] = []
    # Wall clock: when recording was asked for, and when its stop answered
    # (every op lies between them, as the hosts' clocks agree).
    self.start_ns = 0
    self.stop_ns = 0

  def fill(self, reply: dict[str, Any]) -> None:
    for island, records in sorted(reply["islands"].items(),
                                  key=lambda kv: int(kv[0])):
      ops = []
      last_launch_ready = last_receive_ready = latest_launch_ready = 0
      ready_of: dict[int, int] = {}  # seq -> when its results were there
      for seq, kind, name, issued, issue_end, ready, *rest in sorted(records):
        waited = rest[0] if rest else True
        after = rest[1] if len(rest) > 1 else None
        start = issued
        if kind == "launch":
          if after is None:
            # An older worker's record: an island's launches read as one
            # after another, and not before the data received before them.
            start = max(issued, min(last_launch_ready, ready),
                        min(last_receive_ready, ready))
          else:
            start = max([issued] + [min(ready_of.get(s, 0), ready)
                                    for s in after])
          last_launch_ready = ready
          latest_launch_ready = max(latest_launch_ready, ready)
        elif kind == "receive":
          arrived = ready if waited else min(ready, latest_launch_ready)
          last_receive_ready = max(last_receive_ready, arrived)
          ready_of[seq] = arrived
        ready_of.setdefault(seq, ready)
        ops.append(OpTiming(int(island), seq, kind, name, issued,
                            max(issue_end, issued), start, ready))
      self.ops += _in_lanes(ops)

  def islands(self) -> list[int]:
    return sorted({op.island for op in self.ops})

  def launches(self, island: int) -> list[OpTiming]:
    return [op for op in self.ops if op.island == island
            and op.kind == "launch"]

  def utilization(self) -> dict[int, float]:
    """Per island: its time in launches over the span of all launches of all
    islands (first start to last end). 1 - utilization is the island's idle
    fraction: for a pipeline step, its bubble."""
    launches = [op for op in self.ops if op.kind == "launch"]
    if not launches:
      return {}
    span = (max(op.ready_ns for op in launches) -
            min(op.start_ns for op in launches))
    result = {}
    for island in self.islands():
      busy, until = 0, 0  # the union of its launches' times
      for op in sorted(self.launches(island), key=lambda op: op.start_ns):
        busy += max(0, op.ready_ns - max(op.start_ns, until))
        until = max(until, op.ready_ns)
      result[island] = busy / span if span > 0 else 1.0
    return result

  def chrome(self) -> dict[str, Any]:
    """The trace in Chrome's trace-event format (times in µs)."""
    origin = min((op.start_ns for op in self.ops), default=0)
    events: list[dict[str, Any]] = []
    for island in self.islands():
      events.append({"name": "process_name", "ph": "M", "pid": island,
                     "args": {"name": f"island {island}"}})
    for op in self.ops:
      events.append({
          "name": op.name, "cat": op.kind, "ph": "X", "pid": op.island,
          "tid": op.lane, "ts": (op.start_ns - origin) / 1e3,
          "dur": (op.ready_ns - op.start_ns) / 1e3,
          "args": {"seq": op.seq,
                   "issued_us": (op.issued_ns - origin) / 1e3,
                   "issue_cost_us": (op.issue_end_ns - op.issued_ns) / 1e3}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}

  def save(self, path: str) -> None:
    """Writes the Chrome trace (JSON), or a picture if `path` ends in .svg."""
    with open(path, "w", encoding="utf-8") as f:
      if path.endswith(".svg"):
        f.write(self.svg())
      else:
        json.dump(self.chrome(), f)

  def svg(self, width: int = 960) -> str:
    """A timeline picture: one row per island, one box per launch (MPMD
    forward fragments blue, backward orange, others grey), receives as
    thin bars below."""
    drawn = [op for op in self.ops if op.kind in ("launch", "receive")]
    if not drawn:
      return '<svg xmlns="http://www.w3.org/2000/svg"/>'
    origin = min(op.start_ns for op in drawn)
    end = max(op.ready_ns for op in drawn)
    left, row, scale = 80, 34, (width - 100) / max(end - origin, 1)
    islands = self.islands()
    height = 40 + row * len(islands)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{height}" font-family="sans-serif" font-size="11">',
             f'<text x="{left}" y="14">{(end - origin) / 1e6:.1f} ms</text>']
    for r, island in enumerate(islands):
      y = 24 + r * row
      parts.append(f'<text x="4" y="{y + 15}">island {island}</text>')
      # Launches that ran at once share the row's height, a band each.
      band = 20 / (1 + max((op.lane for op in drawn if op.island == island),
                           default=0))
      for op in drawn:
        if op.island != island:
          continue
        x = left + (op.start_ns - origin) * scale
        w = max((op.ready_ns - op.start_ns) * scale, 0.5)
        if op.kind == "receive":
          parts.append(f'<rect x="{x:.1f}" y="{y + 22}" width="{w:.1f}" '
                       'height="3" fill="#bbb"/>')
          continue
        color = ("#4477aa" if "_fwd" in op.name else
                 "#ee7733" if "_bwd" in op.name else "#999999")
        parts.append(f'<rect x="{x:.1f}" y="{y + op.lane * band:.1f}" '
                     f'width="{w:.1f}" height="{band:.1f}"'
                     f' fill="{color}" stroke="white" stroke-width="0.5">'
                     f'<title>{op.name}</title></rect>')
    parts.append("</svg>")
    return "\n".join(parts)


def _in_lanes(ops: list[OpTiming]) -> list[OpTiming]:
  """`ops` of one island with each launch on the first line where nothing
  runs at its start (a line's launches never overlap)."""
  ends: list[int] = []  # per lane: when its last launch ended
  out = []
  for op in sorted(ops, key=lambda op: (op.start_ns, op.seq)):
    if op.kind == "launch":
      lane = next((i for i, end in enumerate(ends) if end <= op.start_ns),
                  len(ends))
      if lane == len(ends):
        ends.append(0)
      ends[lane] = op.ready_ns
      op = op._replace(lane=lane)
    out.append(op)
  return sorted(out, key=lambda op: op.seq)


def _sync() -> None:
  """Returns once the controller has taken every request this process sent
  before: a fetch travels behind them on the same session."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  jax.device_get(jax.device_put(np.zeros((), np.int32)))


def start(timeout: float) -> Trace:
  """Starts recording every island's ops, once the controller has taken the
  work submitted before; stop() fills the Trace returned."""
  address, token = _initialize.connection()
  _sync()
  result = Trace()
  result.start_ns = time.time_ns()
  admin.trace(address, "start", token, timeout)
  return result


def stop(result: Trace, timeout: float) -> None:
  """Stops recording once the work submitted before has finished (at most
  `timeout` seconds) and fills `result` with the islands' ops."""
  address, token = _initialize.connection()
  _sync()
  reply = admin.trace(address, "stop", token, timeout)
  result.stop_ns = time.time_ns()
  result.fill(reply)


@contextlib.contextmanager
def trace(path: str | None = None, timeout: float = 300.0
          ) -> Iterator[Trace]:
  """Records every island's ops while inside; writes `path` on exit if given.

  Leaving waits until the work submitted inside has finished (at most
  `timeout` seconds).
  """
  result = start(timeout)
  try:
    yield result
  finally:
    stop(result, timeout)
    if path is not None:
      result.save(path)
