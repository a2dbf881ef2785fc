"""`jax-pathways worker --restart-in-place` (worker/in_place.py): which exit
codes start the worker again in place, the limit per incident, and a pod's
SIGTERM reaching the worker. The worker is a stand-in that exits with the
codes it is given, one per start, and notes each start in a file."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import processes  # tests/conftest.py puts tests/ on sys.path

# A stand-in worker: its n-th start exits with codes[n] (the last one from
# then on; "sleep" waits for a signal); each start appends its pid.
FAKE_WORKER = textwrap.dedent("""
    import os, sys, time
    starts, codes = sys.argv[1], sys.argv[2:]
    with open(starts, "a") as f:
      f.write(f"{os.getpid()}\\n")
    with open(starts) as f:
      n = len(f.read().split())
    code = codes[min(n, len(codes)) - 1]
    if code == "sleep":
      time.sleep(600)
    sys.exit(int(code))
""")

# The supervisor, with short delays and a limit of 2 quick restarts.
SUPERVISOR = textwrap.dedent("""
    import sys
    from jax_pathways.cluster import restarts
    from jax_pathways.worker import in_place
    restarts.RESTART_DELAYS_S = (0.0, 0.1)
    restarts.MAX_QUICK_RESTARTS = 2
    in_place.WORKER_COMMAND = (sys.executable, "-c", sys.argv[1])
    sys.exit(in_place.run(sys.argv[2:]))
""")


def _supervise(tmp_path, *codes: str) -> tuple[subprocess.Popen, str]:
  starts = str(tmp_path / "starts")
  proc = subprocess.Popen(
      [sys.executable, "-c", SUPERVISOR, FAKE_WORKER, starts, *codes],
      stderr=subprocess.PIPE, text=True, start_new_session=True)
  return proc, starts


def _starts(path: str) -> list[int]:
  try:
    with open(path) as f:
      return [int(p) for p in f.read().split()]
  except FileNotFoundError:
    return []


@pytest.mark.parametrize("codes, exit_code, starts", [
    (("0",), 0, 1),          # stopped by its controller: done
    (("2",), 2, 1),          # cannot start here: no restart, the pod fails
    (("3", "1", "0"), 0, 3),  # dropped, crashed, then stopped: restarted
    # A crash at every start: given up on after 2 quick restarts, leaving
    # with the worker's own code (the Job makes a new pod).
    (("1",), 1, 3),
], ids=["stopped", "cannot-start", "restarted", "given-up"])
def test_exit_codes(tmp_path, codes, exit_code, starts):
  proc, path = _supervise(tmp_path, *codes)
  _, stderr = proc.communicate(timeout=120)  # hang guard
  assert proc.returncode == exit_code, stderr
  assert len(_starts(path)) == starts, stderr
  if starts == 3 and exit_code == 1:
    assert "3 times in a row" in stderr and "new pod" in stderr, stderr


def test_a_killed_worker_is_restarted_and_sigterm_reaches_it(tmp_path):
  """SIGKILL of the worker: started again; SIGTERM to the supervisor only
  (as kubelet sends it to the container's first process): the worker gets
  it and the supervisor leaves with its code."""
  proc, path = _supervise(tmp_path, "sleep")
  try:
    deadline = time.monotonic() + 60  # hang guard
    while len(_starts(path)) < 1:
      assert time.monotonic() < deadline and proc.poll() is None
      time.sleep(0.05)
    [first] = _starts(path)
    os.kill(first, signal.SIGKILL)
    while len(_starts(path)) < 2:
      assert time.monotonic() < deadline and proc.poll() is None
      time.sleep(0.05)
    second = _starts(path)[1]
    os.kill(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "exited with code 137" in stderr, stderr
    assert not processes.alive(second)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait(timeout=10)
