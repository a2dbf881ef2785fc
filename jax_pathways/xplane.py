"""xspace(): one island's part of a Trace in the profiler's XSpace format;
write(): one such file per island into a profile's run directory.

TensorBoard's profile plugin (xprof) and `jax.profiler.ProfileData` read
`<log_dir>/plugins/profile/<run>/<host>.xplane.pb` files, each a serialized
`tensorflow.profiler.XSpace` (the schema is jaxlib's own,
tsl/profiler/protobuf/xplane.proto). An island becomes one "host" with one
device plane, `/device:CUSTOM:<island>` (xprof shows custom device planes
where a machine has no GPU or TPU planes), one line per op kind ("launch",
"receive", ...; "launch 2" and on for launches that ran beside others) and
one event per op, named after its program for launches.
As in the files JAX writes, times are relative to the profile's start, which
a "Task Environment" plane gives as wall-clock ns (profile_start_time), so
the islands' files line up with the client's.

Two writers: the controller, for pathwaysutils' jax.profiler
(controller/profile_executable.py), and the client, for
`jax_pathways.profile()` (profiling.py).
"""
from __future__ import annotations

import os
from typing import Any, Sequence

from jax_pathways.tracing import Trace
from jax_pathways.wire import protos

PLANE_PREFIX = "/device:CUSTOM:"
TASK_ENVIRONMENT = "Task Environment"  # tsl's kTaskEnvPlaneName
_OP_STATS = ("seq", "issued_ns", "issue_end_ns")


def write(trace: Trace, islands: Sequence[int], run_dir: str,
          host: str) -> None:
  """Writes `run_dir`/island_<k>.xplane.pb for each of `islands` (one with
  no ops too: the island was recorded, idle), each whole or not at all;
  raises OSError."""
  os.makedirs(run_dir, exist_ok=True)
  for island in islands:
    path = os.path.join(run_dir, f"island_{island}.xplane.pb")
    with open(f"{path}.tmp", "wb") as f:
      f.write(xspace(trace, island, f"{host}:island_{island}"))
    os.replace(f"{path}.tmp", path)


def xspace(trace: Trace, island: int, hostname: str) -> bytes:
  """The serialized XSpace of `island`'s ops in `trace`, recorded from
  trace.start_ns to trace.stop_ns (wall clock)."""
  space = protos.msg("tensorflow.profiler.XSpace")()
  space.hostnames.append(hostname)
  _device_plane(space.planes.add(id=island, name=f"{PLANE_PREFIX}{island}"),
                trace, island)
  env = space.planes.add(id=island, name=TASK_ENVIRONMENT)
  _stat_names(env, ("profile_start_time", "profile_stop_time"))
  env.stats.add(metadata_id=1, uint64_value=trace.start_ns)
  env.stats.add(metadata_id=2, uint64_value=trace.stop_ns)
  return space.SerializeToString()


def _device_plane(plane: Any, trace: Trace, island: int) -> None:
  """`island`'s ops, timed from trace.start_ns."""
  _stat_names(plane, _OP_STATS)
  start_ns = trace.start_ns
  event_ids: dict[str, int] = {}
  lines: dict[str, Any] = {}
  for op in sorted((op for op in trace.ops if op.island == island),
                   key=lambda op: op.start_ns):
    # Launches running at once (tracing.py's lanes) on lines of their own.
    name = op.kind if not op.lane else f"{op.kind} {op.lane + 1}"
    line = lines.get(name)
    if line is None:
      line = lines[name] = plane.lines.add(
          id=len(lines), name=name, timestamp_ns=op.start_ns - start_ns)
    metadata_id = event_ids.setdefault(op.name, len(event_ids) + 1)
    plane.event_metadata[metadata_id].id = metadata_id
    plane.event_metadata[metadata_id].name = op.name
    event = line.events.add(
        metadata_id=metadata_id,
        offset_ps=(op.start_ns - start_ns - line.timestamp_ns) * 1000,
        duration_ps=max(op.ready_ns - op.start_ns, 0) * 1000)
    for stat_id, value in enumerate(
        (op.seq, op.issued_ns - start_ns, op.issue_end_ns - start_ns), start=1):
      event.stats.add(metadata_id=stat_id, int64_value=value)
  for line in lines.values():
    line.duration_ps = max(e.offset_ps + e.duration_ps for e in line.events)


def _stat_names(plane: Any, names: Sequence[str]) -> None:
  for i, name in enumerate(names, start=1):
    plane.stat_metadata[i].id = i
    plane.stat_metadata[i].name = name
