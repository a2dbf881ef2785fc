"""profile(): a jax.profiler trace that shows what the islands ran.

    with jax_pathways.profile("/tmp/tb"):
      state = train_step(state, batch)

is `jax.profiler.trace("/tmp/tb")` (JAX's own `<host>.xplane.pb` of this
process in `/tmp/tb/plugins/profile/<session>/`) plus, in the same run
directory, one `island_<k>.xplane.pb` per island of this client's slice
(xplane.py): each op an island ran inside, launches named by program, on
the clock of JAX's file, so TensorBoard (xprof), Perfetto through xprof and
`jax.profiler.ProfileData` show the islands beside the client.

The islands record through the admin service as `jax_pathways.trace()` does
(tracing.py) and this process writes the files, so `log_dir` is a local
path here, wherever the controller runs; pathwaysutils' jax.profiler gets
the same files written by the controller (controller/profile_executable.py),
which needs the directory on its filesystem. Not with
`pathwaysutils.initialize()`: the islands keep one recording.
"""
from __future__ import annotations

import contextlib
import os
import socket
import time
from typing import TYPE_CHECKING, Iterator

from jax_pathways import _initialize
from jax_pathways import tracing
from jax_pathways import xplane
from jax_pathways.cluster import addresses
from jax_pathways.tracing import Trace

if TYPE_CHECKING:
  import jax


@contextlib.contextmanager
def profile(log_dir: str | os.PathLike[str],
            profiler_options: jax.profiler.ProfileOptions | None = None,
            timeout: float = 300.0) -> Iterator[Trace]:
  """Takes a jax.profiler trace into `log_dir` with the islands' ops in it.

  Yields the islands' Trace, filled on leaving, which waits until the work
  submitted inside has finished (at most `timeout` seconds).
  `profiler_options.session_id`, if set, names the run directory, as for
  jax.profiler; if not, a timestamp, which is set on `profiler_options`.
  """
  # `import jax_pathways` leaves JAX unimported (as tracing._sync does).
  import jax  # pylint: disable=import-outside-toplevel,redefined-outer-name
  log_dir = os.fspath(log_dir)
  if "://" in log_dir:
    raise ValueError(f"jax_pathways.profile writes the islands' files into "
                     f"a local directory, not {log_dir!r}")
  options = profiler_options or jax.profiler.ProfileOptions()
  if not options.session_id:
    # JAX names its run directory after the session: naming it here says
    # where the islands' files go (as pathwaysutils does).
    options.session_id = time.strftime("%Y_%m_%d_%H_%M_%S")
  run_dir = os.path.join(log_dir, "plugins", "profile", options.session_id)
  address, _ = _initialize.connection()  # not initialized: says so first
  islands = sorted({d.slice_index for d in jax.devices()})

  # JAX's window holds the islands': their files start after its own.
  jax.profiler.start_trace(log_dir, profiler_options=options)
  try:
    recorded = tracing.start(timeout)
  except BaseException:
    jax.profiler.stop_trace()
    raise
  try:
    yield recorded
  finally:
    try:
      tracing.stop(recorded, timeout)
    finally:
      jax.profiler.stop_trace()  # writes JAX's run directory
    xplane.write(recorded, islands, run_dir, _host(address))


def _host(address: str) -> str:
  """The controller's host, which names the islands in the files as the
  controller names them (after its own hostname)."""
  target = addresses.dial_target(address)
  host = "" if addresses.is_unix(target) else target.rsplit(":", 1)[0]
  if host in ("", "localhost", "127.0.0.1", "[::1]"):  # this host's
    return socket.gethostname()
  return host
