"""Threads with OS-visible names (top -H, perf), like the C++ core's."""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable

_PR_SET_NAME = 15
# The process's own symbols (libc's among them): find_library("c") would
# fork `ldconfig -p` at import, in processes whose threads are running.
_libc = ctypes.CDLL(None, use_errno=True)


def start(target: Callable[..., Any], name: str, *args: Any) -> threading.Thread:
  """Starts a daemon thread named `name` in Python and in the OS."""

  def run() -> None:
    _libc.prctl(_PR_SET_NAME, name[:15].encode(), 0, 0, 0)
    target(*args)

  thread = threading.Thread(target=run, name=name, daemon=True)
  thread.start()
  return thread
