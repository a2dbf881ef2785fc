"""pathwaysutils' elastic Manager and @elastic_retry, unchanged, against
jax_pathways (issue 18, item 3a): a worker killed or stopped mid-training,
the retry resumes from the user's last good state and training finishes.

Each test runs trainer.py, a client with an embedded cluster of its own (the
session's cluster is never harmed), and judges its JSON lines. Every process
it started is stopped by pid at the end; every wait is bounded.
"""
from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any, Iterator

import numpy as np
import pytest

import processes  # tests/conftest.py puts tests/ on sys.path
import restarting_cluster

pytestmark = pytest.mark.integration

TRAINER = os.path.join(os.path.dirname(__file__), "trainer.py")


@dataclasses.dataclass(frozen=True)
class Size:
  devices_per_island: int
  steps: int
  save_every: int
  fault_at: int  # mid-way between two saves: the retry repeats steps


SMALL = Size(devices_per_island=2, steps=24, save_every=4, fault_at=10)
# The embedded cluster's default shape, and a longer run.
FULL = Size(devices_per_island=4, steps=96, save_every=8, fault_at=44)
SIZES = [pytest.param(SMALL, id="small"),
         pytest.param(FULL, id="full", marks=pytest.mark.slow)]


class Trainer:
  """A trainer.py process and its JSON lines, read with deadlines."""

  def __init__(self, tmp_path: Any, *args: str) -> None:
    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)  # the session's 'proxy,cpu' is not its
    self._stderr_path = tmp_path / "trainer.stderr"
    with open(self._stderr_path, "wb") as stderr:
      self.proc = subprocess.Popen(
          [sys.executable, TRAINER, *args], env=env, stdout=subprocess.PIPE,
          stderr=stderr, text=True, start_new_session=True, cwd=tmp_path)
    self.lines: list[dict[str, Any]] = []
    # The cluster's, restarted workers too, and the faults' victims, each
    # pinned when the trainer names it (processes.pin).
    self.pids: dict[int, int | None] = {}
    self.victims: list[int | None] = []

  def until(self, keys: tuple[str, ...], timeout: float) -> dict[str, Any]:
    """The next line holding one of `keys`. TimeoutError if none comes
    within `timeout` seconds while it runs; AssertionError if it ends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      msg = self._read(0.2)
      if msg is not None and any(k in msg for k in keys):
        return msg
      if msg is None and self.proc.poll() is not None:
        raise AssertionError(
            f"the trainer exited with code {self.proc.returncode} before any"
            f" of {keys}; stderr ends:\n{self.stderr()[-3000:]}")
    raise TimeoutError(f"none of {keys} from the trainer within {timeout} s;"
                       f" stderr ends:\n{self.stderr()[-3000:]}")

  def _read(self, timeout: float) -> dict[str, Any] | None:
    """One line, if one comes within `timeout` seconds."""
    if not select.select([self.proc.stdout], [], [], timeout)[0]:
      return None
    line = self.proc.stdout.readline()
    if not line:  # it closed its output: it is ending
      time.sleep(timeout)
      return None
    msg = json.loads(line)
    self.lines.append(msg)
    for pid in msg.get("pids", []):
      if pid not in self.pids:
        self.pids[pid] = processes.pin(pid)
    if "fault" in msg:
      self.victims.append(processes.pin(msg["pid"]))
    return msg

  def first(self, key: str) -> dict[str, Any]:
    return next(m for m in self.lines if key in m)

  def stderr(self) -> str:
    return self._stderr_path.read_text(errors="replace")

  def close(self) -> None:
    """Stops it, then what is left of its cluster: a stopped worker first
    (nothing else ends it), then the rest, which follow their controller,
    which follows the trainer."""
    processes.stop([self.proc])
    while self._read(0) is not None:  # pids it said that were not read yet
      pass
    self.proc.stdout.close()
    for victim in self.victims:
      processes.send(victim, signal.SIGKILL)
      processes.send(victim, signal.SIGCONT)
    deadline = time.monotonic() + 15
    while (time.monotonic() < deadline and
           not all(processes.ended(fd) for fd in self.pids.values())):
      time.sleep(0.1)
    left = [p for p, fd in self.pids.items() if not processes.ended(fd)]
    for p in left:
      processes.send(self.pids[p], signal.SIGKILL)
    for fd in [*self.pids.values(), *self.victims]:
      if fd is not None:
        os.close(fd)
    assert not left, f"processes {left} outlived the trainer"


@pytest.fixture
def trainer(tmp_path: Any) -> Iterator[Any]:
  """start(size, *args): a Trainer of that size; closed at the end."""
  started: list[Trainer] = []

  def start(size: Size, *args: str) -> Trainer:
    t = Trainer(tmp_path, "--devices-per-island",
                str(size.devices_per_island), "--steps", str(size.steps),
                "--save-every", str(size.save_every), "--fault-at",
                str(size.fault_at), *args)
    started.append(t)
    return t

  yield start
  for t in started:
    t.close()


def _follow(t: Trainer, retry_within: float) -> dict[str, Any]:
  """Follows a run to its end: the fault, the retry (within `retry_within`
  s of the fault), then what training came to ("done"). Prints how long
  the loss took to see and to get over."""
  t.until(("fault",), 180)
  t.until(("elastic",), retry_within)
  end = t.until(("done", "failed"), 180)
  if "failed" in end:
    raise AssertionError(f"training failed: {end}\nstderr ends:\n"
                         f"{t.stderr()[-3000:]}")
  fault, elastic = t.first("fault"), t.first("elastic")
  print(f"{fault['fault']}: detected {elastic['t'] - fault['t']:.2f} s after "
        f"the fault, first step of the retry read back "
        f"{t.first('resumed')['t'] - elastic['t']:.2f} s later")
  return end


def _check_retry(t: Trainer, end: dict[str, Any], size: Size,
                 active: list[int], devices: int, *says: str) -> None:
  """One loss (DATA_LOSS, saying all of `says`), one retry on `active`
  slices' `devices` devices, resumed from the last state saved before the
  fault."""
  errors = end["faulty"]["errors"]
  assert len(errors) == 1, errors
  assert all(w in errors[0] for w in ("DATA_LOSS", *says)), errors
  last_save = size.fault_at // size.save_every * size.save_every
  assert end["faulty"]["attempts"][1] == {
      "active": active, "devices": devices, "from_step": last_save}, end


def _victim(t: Trainer) -> str:
  """How errors name the worker the trainer killed or stopped."""
  return f"pid {t.first('fault')['pid']}"


def _assert_bit_identical(end: dict[str, Any]) -> None:
  assert end["faulty"]["params"] == end["reference"]["params"]
  assert end["faulty"]["losses"] == end["reference"]["losses"]


def _assert_loss_falls(end: dict[str, Any], size: Size) -> None:
  """After the retry the loss goes on falling: the last steps' mean is
  below that of the steps before the fault."""
  losses = end["faulty"]["losses"]
  before = np.mean(losses[size.fault_at - 4:size.fault_at])
  assert np.mean(losses[-4:]) < 0.8 * before, losses


# A killed worker's connection drops at once; the retry comes within 10 s.
# A stopped one is lost after --worker-timeout 2 s of silence.
KILLED_WITHIN_S = 10
STOPPED_WITHIN_S = 2 + 8


@pytest.mark.parametrize("size", SIZES)
def test_killed_worker_rejoins_and_training_ends_bit_identical(trainer, size):
  """minimum_slice_count = all, the mesh on the victim's island: the retry
  waits for the supervisor's new worker, then repeats the lost steps."""
  t = trainer(size, "--fault", "kill", "--mesh", "one")
  end = _follow(t, KILLED_WITHIN_S)
  _check_retry(t, end, size, [0, 1], size.devices_per_island, _victim(t),
               "is lost")
  assert end["restarts"] == [0, 1], end
  _assert_bit_identical(end)


def test_killed_worker_rejoins_under_a_mesh_spanning_islands(trainer):
  t = trainer(SMALL, "--fault", "kill", "--mesh", "all")
  end = _follow(t, KILLED_WITHIN_S)
  # Island 0's worker may see the loss first, in gloo: it cannot name it.
  _check_retry(t, end, SMALL, [0, 1], 2 * SMALL.devices_per_island)
  assert end["restarts"] == [0, 1], end
  _assert_bit_identical(end)


@pytest.mark.parametrize("size", SIZES)
def test_stopped_worker_training_goes_on_on_the_other_island(trainer, size):
  """minimum_slice_count=1, the mesh on the last active slice, the state in
  Orbax checkpoints: island 1's worker stops; after the controller's
  timeout the retry restores the checkpoint onto island 0 and trains on
  (the supervisor replaces the stopped worker meanwhile). As many devices of the same kind: the same
  bits as the uninterrupted run on island 1."""
  t = trainer(size, "--fault", "stop", "--mesh", "one", "--min-slices", "1",
              "--worker-timeout", "2", "--store", "orbax")
  end = _follow(t, STOPPED_WITHIN_S)
  _check_retry(t, end, size, [0], size.devices_per_island, _victim(t),
               "sent nothing")
  # The supervisor replaces the stopped worker about a second after the
  # loss; training on island 0 may have ended by then.
  assert end["restarts"][0] == 0 and end["restarts"][1] <= 1, end
  _assert_loss_falls(end, size)
  _assert_bit_identical(end)


def test_stopped_worker_under_a_mesh_spanning_islands(trainer):
  """The canonical shrink: data parallel over every active slice."""
  t = trainer(SMALL, "--fault", "stop", "--mesh", "all", "--min-slices", "1",
              "--worker-timeout", "2")
  end = _follow(t, STOPPED_WITHIN_S)
  _check_retry(t, end, SMALL, [0], SMALL.devices_per_island)
  _assert_loss_falls(end, SMALL)


def test_cli_cluster_killed_worker_rejoins_under_a_mesh_spanning_islands(
    trainer):
  """The same on a cluster of CLI processes over TCP, its workers
  restarted by an orchestrator's policy (restarting_cluster.py)."""
  with restarting_cluster.started(2, SMALL.devices_per_island,
                                  worker_timeout=2.0) as cluster:
    t = trainer(SMALL, "--fault", "kill", "--mesh", "all", "--address",
                cluster.address, "--token", restarting_cluster.TOKEN)
    end = _follow(t, KILLED_WITHIN_S)
    assert cluster.restarts == 1
  _check_retry(t, end, SMALL, [0, 1], 2 * SMALL.devices_per_island)
  assert end["restarts"] == [0, 1], end
  _assert_bit_identical(end)
