"""Processes a test started: whether one still runs, and stopping them."""
from __future__ import annotations

import os
import re
import signal
import subprocess

# A line at WARNING or above, as absl's C++ (W1128 12:00:00.0 ...) or
# Python's logging writes it: what a healthy process's stderr never has.
LOUD = re.compile(r"^([WEF]\d{4} |(WARNING|ERROR|CRITICAL)\b)", re.M)


def alive(pid: int) -> bool:
  """Whether `pid` runs (a zombie of an exited child does not)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split()[2] != "Z"
  except OSError:
    return False


def stop(procs: list[subprocess.Popen]) -> None:
  """SIGTERM to each one's process group, SIGKILL to those still there
  after 10 s (they were started with start_new_session=True)."""
  for p in procs:
    if p.poll() is None:
      os.killpg(p.pid, signal.SIGTERM)
  for p in procs:
    try:
      p.wait(timeout=10)
    except subprocess.TimeoutExpired:
      os.killpg(p.pid, signal.SIGKILL)
      p.wait(timeout=5)


def rss(pid: int) -> int:
  """`pid`'s resident memory, in bytes."""
  with open(f"/proc/{pid}/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) * 1024
  raise ValueError(f"no VmRSS for pid {pid}")
