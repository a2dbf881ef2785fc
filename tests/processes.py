"""Processes a test started: whether one still runs, and stopping them."""
from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import time
from typing import Any, Iterator

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


def freeze(pid: int, timeout_s: float = 30.0) -> None:
  """SIGSTOP to `pid`, returning once every thread of it has stopped. The
  kernel stops a process's threads one by one, once the thread it woke to
  take the signal runs: on a loaded machine the others meanwhile go on,
  and a request arriving then (a test's next call) is still answered."""
  os.kill(pid, signal.SIGSTOP)
  deadline = time.monotonic() + timeout_s
  while not _all_stopped(pid):
    assert time.monotonic() < deadline, f"pid {pid} did not stop"
    time.sleep(0.005)


def _all_stopped(pid: int) -> bool:
  try:
    tasks = os.listdir(f"/proc/{pid}/task")
  except OSError:
    return True  # gone: nothing of it runs
  for tid in tasks:
    try:
      with open(f"/proc/{pid}/task/{tid}/stat") as f:
        state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
      continue  # the thread has ended
    if state not in ("T", "t", "Z", "X"):
      return False
  return True


def started(pid: int) -> int | None:
  """When `pid` started (clock ticks since boot), None if it is gone: with
  its pid, it names one process (pids are reused; see pin)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return int(f.read().rsplit(")", 1)[1].split()[19])
  except (OSError, IndexError, ValueError):
    return None


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


@contextlib.contextmanager
def running(cluster: Any) -> Iterator[Any]:
  """A LocalCluster started for a test or module; stopped at the end, and
  every one of its processes checked gone."""
  cluster.start()
  pids = cluster.pids
  try:
    yield cluster
  finally:
    cluster.stop()
    for pid in pids:
      assert not alive(pid), f"process {pid} outlived the cluster"
