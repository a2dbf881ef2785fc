"""ProfileExecutable: pathwaysutils' profiling program, run by the islands' tracers.

pathwaysutils compiles one PluginProgram per `jax.profiler.start_trace` and
executes it twice: the first execution starts recording, the second stops it
(pathwaysutils/profiling.py). Starting puts a "start" TRACE op into the order
of every island of the client's slice (controller/op_timing.py, the same
recording as `jax_pathways.trace()`); stopping puts a "stop" one there, which
the islands answer once everything submitted before it has finished, and
writes each island's ops as `<log_dir>/plugins/profile/<run>/island_<k>.xplane.pb`.
`<run>` is the session name pathwaysutils also gives JAX, which names its own
run directory after it, so TensorBoard and Perfetto show the islands beside
the client's trace.

The controller writes the files itself: the directory must be on its
filesystem (the embedded cluster's always is; a remote controller needs a
shared one). pathwaysutils reads nothing from the executions' results, so
carrying the bytes back to the client would not get them written there.

Nothing waits: both executions answer through the status the client awaits
(its execution token), set when the islands have done the TRACE op (and,
for stop, the files are written, on a thread of their own).
"""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Any, Callable, Sequence

from absl import logging

from jax_pathways import threads, xplane
from jax_pathways.controller import op_timing
from jax_pathways.controller import uncompiled
from jax_pathways.controller.launch_context import LaunchContext
from jax_pathways.programs.plugin_program import ProfileRequest
from jax_pathways.programs.sharding import Sharding
from jax_pathways.status import Code, Status, failed_precondition, invalid_argument
from jax_pathways.tracing import Trace


OnDone = Callable[..., None]  # (status, *_), as launches report


class ProfileExecutable:
  """One start_trace/stop_trace pair of one client, as the execute handler
  sees an executable: no parameters, and the one output pathwaysutils
  expects with xprof options (a failed array: it reads nothing)."""

  donated: tuple[int, ...] = ()
  num_parameters = 0

  def __init__(self, request: ProfileRequest, owner: int,
               devices: tuple[int, ...], islands: Sequence[int]):
    self.request = request
    self.devices = devices
    n = 1 if request.has_result else 0
    self.outputs: list[tuple[tuple[int, ...], str]] = [((1,), "uint8")] * n
    self.output_shardings = [Sharding(devices[:1])] * n
    self.output_islands: list[tuple[Any, ...]] = [()] * n
    self.metadata = uncompiled.metadata("pathways_profile", [1] * n)
    self._owner = owner
    self._islands = list(islands)
    self._state = "new"  # -> recording -> stopping (or abandoned)
    self._start_ns = 0  # wall clock, when recording was asked for

  def check_argument(self, i: int, array: Any) -> None:
    raise invalid_argument("the profiling program takes no arguments")

  def launch(self, context: LaunchContext, args: Sequence[Any],
             results: Sequence[int], on_done: OnDone | None) -> None:
    """Starts recording on the first call, stops and writes on the second."""
    report = on_done or (lambda status, *_: None)
    if self._state == "new":
      context.recording.claim(self._owner)
      self._state, self._start_ns = "recording", time.time_ns()

      def started(status: Status, _: bytes) -> None:
        if not status.ok:
          context.recording.release(self._owner)
        report(status)

      op_timing.trace(context.topology, context.dispatcher, "start", started,
                      self._islands)
    elif self._state == "recording":
      self._state = "stopping"

      def stopped(status: Status, body: bytes) -> None:
        stop_ns = time.time_ns()
        context.recording.release(self._owner)
        if not status.ok:
          report(status)
          return
        # Seconds of work for a full recording: not on the dispatcher's
        # completion thread, which every client's launches report through.
        threads.start(lambda: report(self._write(body, stop_ns)),
                      "jp-profile")

      op_timing.trace(context.topology, context.dispatcher, "stop", stopped,
                      self._islands)
    else:
      raise failed_precondition(
          f"this profile is {self._state}; start_trace compiles a new one")

  def abandon(self, context: LaunchContext) -> None:
    """The client let go of it (or ended) while recording: stop, discard."""
    if self._state == "recording":
      self._state = "abandoned"
      context.recording.release(self._owner)
      op_timing.trace(context.topology, context.dispatcher, "stop",
                      lambda *_: None, self._islands)

  def _write(self, body: bytes, stop_ns: int) -> Status:
    """Writes each island's XSpace; why not, if it could not."""
    trace = Trace()
    try:
      trace.fill(json.loads(body))
    except (ValueError, TypeError) as e:  # a worker's records, malformed
      return Status(Code.DATA_LOSS, f"unreadable island trace: {e!r}")
    trace.start_ns, trace.stop_ns = self._start_ns, stop_ns
    run = self.request.session_name or time.strftime("%Y_%m_%d_%H_%M_%S")
    run_dir = os.path.join(self.request.trace_dir, "plugins", "profile", run)
    host = socket.gethostname()
    try:
      xplane.write(trace, self._islands, run_dir, host)
    except OSError as e:
      return Status(Code.FAILED_PRECONDITION,
                    f"could not write the islands' traces to {run_dir} on the "
                    f"controller's host {host}: {e}")
    logging.info("client %d: %d ops of islands %s written to %s", self._owner,
                 len(trace.ops), self._islands, run_dir)
    return Status()
