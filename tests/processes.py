"""Processes a test started: whether one still runs, and stopping them."""
from __future__ import annotations

import os
import re
import select
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


def pin(pid: int) -> int | None:
  """A pidfd for `pid` while it runs, None if it is gone. Signals sent
  through it (send) reach that process or nothing: the suite starts more
  processes and threads than this machine's pid_max (32768), so a pid kept
  from earlier may name another test's process by the time it is used."""
  try:
    return os.pidfd_open(pid)
  except ProcessLookupError:
    return None


def send(pidfd: int | None, sig: int) -> bool:
  """`sig` to the process `pidfd` pins (pin); False if it has ended."""
  if pidfd is None:
    return False
  try:
    signal.pidfd_send_signal(pidfd, sig)
    return True
  except ProcessLookupError:
    return False


def ended(pidfd: int | None) -> bool:
  """Whether the process `pidfd` pins has exited (a pidfd reads ready)."""
  return pidfd is None or bool(select.select([pidfd], [], [], 0)[0])


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
