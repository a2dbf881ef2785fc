"""Lanes on their own: a lane runs its tasks in order, each after what it
depends on (a result of another lane's task, another task's issue), and a
lane's thread ends when idle and starts again with the next task."""
import threading
import time

from jax_pathways.worker import callback_lanes
from jax_pathways.worker.callback_lanes import Lane, Pending, Task

WAIT_S = 10.0  # only catches hangs


def _task(lane, log, name, after=(), results=0, gate=None):
  def run(task):
    if gate is not None:
      assert gate.wait(WAIT_S)
    log.append(name)
    for i, pending in enumerate(task.results):
      pending.resolve(f"{name}.{i}")
  return Task(run, list(after), [Pending(lane) for _ in range(results)],
              lane)


def test_a_lane_runs_its_tasks_in_order():
  lane, log = Lane("jp-test-lane"), []
  tasks = [_task(lane, log, str(i), results=1) for i in range(20)]
  for t in tasks:
    lane.submit(t)
  assert tasks[-1].results[0].wait() == "19.0"
  assert log == [str(i) for i in range(20)]


def test_a_task_waits_for_what_it_depends_on():
  a, b, log = Lane("jp-test-a"), Lane("jp-test-b"), []
  gate = threading.Event()
  first = _task(a, log, "first", results=1, gate=gate)
  second = _task(b, log, "second", after=first.results, results=1)
  third = _task(b, log, "third", after=[first])  # its issue, not results
  a.submit(first)
  b.submit(second)
  b.submit(third)
  assert not second.issued.wait(0.1)  # held for first's result
  gate.set()
  third.issued.wait(WAIT_S)
  assert log == ["first", "second", "third"]
  assert second.results[0].wait() == "second.0"


def test_an_idle_lane_ends_its_thread_and_starts_again(monkeypatch):
  monkeypatch.setattr(callback_lanes, "IDLE_S", 0.05)
  lane, log = Lane("jp-test-idle"), []
  lane.submit(_task(lane, log, "one"))
  deadline = time.monotonic() + WAIT_S
  while any(t.name == "jp-test-idle" for t in threading.enumerate()):
    assert time.monotonic() < deadline, "the idle lane's thread never ended"
    time.sleep(0.01)
  assert log == ["one"]
  done = _task(lane, log, "two")
  lane.submit(done)
  assert done.issued.wait(WAIT_S)
  assert log == ["one", "two"]
