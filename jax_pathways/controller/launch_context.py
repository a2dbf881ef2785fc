"""LaunchContext: what running a loaded executable needs of the controller.

Executables (compile_cache.CompiledProgram, mpmd_executable,
profile_executable), their gangs (gangs.py) and the moves between islands
(moves.py) take this, not the sessions' whole `Services` (session.py), which
provides it: session.py imports them, so they must not import it back.
"""
from __future__ import annotations

from typing import Any, Protocol

from jax_pathways.controller.coordination import GlobalClient
from jax_pathways.controller.dispatcher import ClientDispatcher, Dispatcher
from jax_pathways.controller.op_timing import Recording
from jax_pathways.resources.topology import Topology


class LaunchContext(Protocol):
  """Read by launches; `move_plans` (moves.planned's) is written too."""
  topology: Topology
  # The controller's; a session's is its own ClientDispatcher of it.
  dispatcher: Dispatcher | ClientDispatcher
  # Its generations: which workers programs spanning islands run on.
  global_client: GlobalClient | None
  # Whose jax.profiler trace the islands record.
  recording: Recording
  move_plans: dict[tuple[Any, ...], Any]
