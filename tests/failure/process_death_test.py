"""A dead, or stopped, worker or controller: clear errors within seconds, no
hang, no client abort, no leftover processes; a program spanning the lost
island ends on the others, which keep serving. Each test runs its own client
process with its own embedded cluster."""
import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

import processes  # tests/conftest.py puts tests/ on sys.path

pytestmark = pytest.mark.integration

VICTIM = os.path.join(os.path.dirname(__file__), "victim.py")
SPANNING_VICTIM = os.path.join(os.path.dirname(__file__), "spanning_victim.py")


class Client:
  """The victim client process and its JSON lines, read with deadlines."""

  def __init__(self, what: str):
    """what: "worker" or "controller" (victim.py's argument), or "spanning"
    (spanning_victim.py)."""
    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)
    args = [SPANNING_VICTIM] if what == "spanning" else [VICTIM, what]
    self.proc = subprocess.Popen([sys.executable, *args], env=env,
                                 stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    self._stderr = None

  def read(self, key: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
      if ready:
        line = self.proc.stdout.readline()
        if not line:
          break
        msg = json.loads(line)
        if key in msg:
          return msg
    raise AssertionError(f"no {key!r} from the client within {timeout} s; "
                         f"stderr ends:\n{self.stderr()[-3000:]}")

  def stderr(self) -> str:
    if self.proc.poll() is None:
      self.proc.kill()
    if self._stderr is None:
      self._stderr = self.proc.stderr.read()
    return self._stderr

  def close(self) -> None:
    if self.proc.poll() is None:
      self.proc.kill()
    self.proc.wait(timeout=10)


def _wait_gone(pinned: dict[int, int | None], timeout: float) -> list[int]:
  """The pids of `pinned` ({pid: pidfd}) still running after `timeout`."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if all(processes.ended(fd) for fd in pinned.values()):
      return []
    time.sleep(0.1)
  return [p for p, fd in pinned.items() if not processes.ended(fd)]


@pytest.fixture
def client(request):
  c = Client(request.param)
  pids = c.read("controller", 120)
  pinned = {p: processes.pin(p)
            for p in [pids["controller"], *pids["workers"]]}
  pids["pinned"] = pinned
  yield c, pids
  c.close()
  for pid in pids["workers"]:  # a stopped worker must see its end
    processes.send(pinned[pid], signal.SIGCONT)
  leftovers = _wait_gone(pinned, 15)
  for p in leftovers:
    processes.send(pinned[p], signal.SIGKILL)
  for fd in pinned.values():
    if fd is not None:
      os.close(fd)
  assert not leftovers, f"processes {leftovers} outlived their client"


@pytest.mark.parametrize("client", ["worker"], indirect=True)
def test_worker_death_fails_calls_with_clear_error(client):
  c, pids = client
  c.read("ready", 60)
  victim = pids["workers"][1]
  time.sleep(0.5)  # let it run steps with launches in flight
  killed_at = time.time()
  os.kill(victim, signal.SIGKILL)
  seen = c.read("error", 30)
  assert seen["error"] is not None
  assert "island 1" in seen["error"] and f"pid {victim}" in seen["error"]
  print(f"error {seen['t'] - killed_at:.2f} s after the kill")
  # Later calls fail at once (the read's bound only catches a hang).
  later = c.read("later_error", 10)
  assert "island 1" in later["later_error"]
  assert c.read("island0", 30)["island0"] == [1.0, 2.0, 3.0, 4.0]
  c.read("done", 30)
  assert c.proc.wait(timeout=30) == 0


@pytest.mark.parametrize("client", ["controller"], indirect=True)
def test_controller_death_fails_calls_without_abort(client):
  c, pids = client
  c.read("ready", 60)
  time.sleep(0.5)
  killed_at = time.time()
  os.kill(pids["controller"], signal.SIGKILL)
  seen = c.read("error", 30)
  # JAX's client reports the broken connection (from the session stream or
  # the host-buffer channel, whichever notices first)...
  assert "UNAVAILABLE" in seen["error"], seen
  print(f"error {seen['t'] - killed_at:.2f} s after the kill")
  later = c.read("later_error", 10)
  assert "UNAVAILABLE" in later["later_error"], later
  puts = c.read("put_errors", 30)["put_errors"]
  assert all(e and "UNAVAILABLE" in e for e in puts), puts
  c.read("done", 30)
  assert c.proc.wait(timeout=30) == 0  # no abort at exit
  # ... and jax_pathways names the dead process.
  assert f"the controller (pid {pids['controller']}) exited" in c.stderr()
  # Workers notice their controller is gone and exit on their own: before
  # jaxlib's coordination agent, which aborts a worker whose service is
  # gone (the service outlives the controller: coordination_host.py).
  assert not _wait_gone({p: pids["pinned"][p] for p in pids["workers"]}, 10)
  for i in range(len(pids["workers"])):
    with open(os.path.join(pids["logs"], f"worker{i}.log"),
              errors="replace") as f:
      log = f.read()
    assert "controller is gone" in log, log[-2000:]
    assert "Terminating process" not in log, log[-2000:]


@pytest.mark.parametrize("client", ["spanning"], indirect=True)
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGSTOP],
                         ids=["killed", "stopped"])
def test_lost_worker_ends_programs_spanning_its_island(client, signum):
  c, pids = client
  c.read("ready", 120)
  victim = pids["workers"][1]
  time.sleep(0.5)  # inside the spanning program's all-reduces
  lost_at = time.time()
  if signum == signal.SIGSTOP:
    processes.freeze(victim)
  else:
    os.kill(victim, signum)
  seen = c.read("error", 30)
  assert seen["error"] is not None
  assert "DATA_LOSS" in seen["error"], seen
  assert "island 1" in seen["error"] and f"pid {victim}" in seen["error"]
  # Stopped: declared lost by its silence (the worker timeout), while it
  # is still stopped: at 52b5207 the call failed only once it resumed,
  # which here is after the read's bound. Killed: at once.
  print(f"error {seen['t'] - lost_at:.2f} s after the signal")
  if signum == signal.SIGSTOP:
    assert "it sent nothing, not even a heartbeat" in seen["error"], seen
    assert "--worker-timeout" in seen["error"], seen
  # Island 0's worker left the spanning program and serves its own work.
  island0 = c.read("island0_same", 30)
  assert island0["island0_same"] is True
  # So does a new client, placed on the island that is left.
  new = c.read("new_client_same", 150)
  assert new["new_client_same"] is True, new
  status = {i["island"]: i for i in c.read("status", 10)["status"]}
  assert status[0]["alive"] is True and not status[0]["error"]
  assert status[1]["alive"] is False
  assert f"pid {victim}" in status[1]["error"]
  c.read("done", 30)
  assert c.proc.wait(timeout=30) == 0
