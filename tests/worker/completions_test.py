"""A worker reports an op as done even when a later op already consumed
one of its arrays (a donating launch): failing it would poison its other
results, which are fine."""
import threading
import time

import jax
import numpy as np

from jax_pathways.status import Code, Status
from jax_pathways.worker import completions as completions_lib
from jax_pathways.worker.completions import Completions, error_status


def test_an_array_donated_by_a_later_op_counts_as_ready(cpu_devices):
  cpu = cpu_devices[0]
  made = jax.device_put(np.ones(4, np.float32), cpu)
  kept = jax.device_put(np.zeros(4, np.float32), cpu)
  consume = jax.jit(lambda a: a * 2, donate_argnums=0)
  consume(made).block_until_ready()
  assert made.is_deleted()

  reports, done = [], threading.Event()

  def report(seq, status, payload, waited):
    del payload, waited
    reports.append((seq, status.code))
    if len(reports) == 2:
      done.set()

  completions = Completions(report)
  completions.add(1, [made, kept])
  completions.add(2, [jax.device_put(np.ones(2), cpu)],
                  lambda: (_ for _ in ()).throw(ValueError("bad")))
  assert done.wait(10)
  completions.close()
  assert reports == [(1, Code.OK), (2, Code.INVALID_ARGUMENT)]


class _Pending:
  """An array still being computed until `done` is set."""

  def __init__(self, done: threading.Event):
    self._done = done

  def is_deleted(self) -> bool:
    return False

  def is_ready(self) -> bool:
    return self._done.is_set()

  def block_until_ready(self) -> "_Pending":
    assert self._done.wait(10)
    return self


def test_a_report_says_whether_its_arrays_were_still_being_computed(
    cpu_devices):
  """The trace needs it (and only asks while tracing): an op found done
  was done some time before."""
  release = threading.Event()
  ready = jax.device_put(np.ones(2, np.float32), cpu_devices[0])
  ready.block_until_ready()
  reports, done = {}, threading.Event()

  def report(seq, status, payload, waited):
    del status, payload
    reports[seq] = waited
    if len(reports) == 2:
      done.set()

  for tracing, expected in ((True, {1: True, 2: False}),
                            (False, {1: False, 2: False})):
    release.clear()
    reports.clear()
    done.clear()
    completions = Completions(report, tracing=lambda t=tracing: t)
    completions.add(1, [_Pending(release)])
    completions.add(2, [ready])
    threading.Timer(0.2, release.set).start()
    assert done.wait(10)
    completions.close()
    assert reports == expected


def test_abandoned_spanning_work_is_reported_once_and_blocks_nothing(
    cpu_devices):
  """A program spanning a lost island never finishes: abandoning it reports
  it (and later spanning work) failed at once, while the island's own work
  is reported as usual, never behind it."""
  never, late = threading.Event(), threading.Event()
  reports: list[tuple[int, int]] = []
  seen = threading.Condition()

  def report(seq, status, payload, waited):
    del payload, waited
    with seen:
      reports.append((seq, status.code))
      seen.notify_all()

  def wait_for(n):
    with seen:
      assert seen.wait_for(lambda: len(reports) >= n, 10), reports

  completions = Completions(report)
  completions.add(1, [_Pending(never)], spanning=True)
  completions.add(2, [_Pending(late)], spanning=True)
  completions.add(3, [jax.device_put(np.ones(2), cpu_devices[0])])
  wait_for(1)
  assert reports == [(3, Code.OK)]
  completions.abandon_spanning(Status(Code.DATA_LOSS, "island 1 is lost"))
  completions.add(4, [_Pending(never)], spanning=True)
  wait_for(4)
  assert sorted(reports) == [(1, Code.DATA_LOSS), (2, Code.DATA_LOSS),
                             (3, Code.OK), (4, Code.DATA_LOSS)]
  late.set()  # finishing after all changes nothing
  never.set()
  completions.close()
  assert len(reports) == 4


def test_a_broken_gloo_connection_reads_as_the_loss_of_an_island():
  """A program spanning islands whose peer worker died fails in gloo's
  transport, as UNKNOWN; the user (pathwaysutils retries on DATA_LOSS) must
  read the loss. Gloo's other errors keep their code."""
  broken = RuntimeError(
      "UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/"
      "pair.cc:538] Read error [127.0.0.1]:18319: Connection reset by peer")
  status = error_status(broken)
  assert status.code == Code.DATA_LOSS
  assert "spans islands" in status.message
  assert "Connection reset by peer" in status.message
  # A later program that took the failed array: XLA:CPU says INTERNAL and
  # wraps the error once per program on the way.
  chained = error_status(RuntimeError(
      "INTERNAL: Error dispatching computation: Error dispatching "
      "computation: Gloo all-to-all failed: [external/gloo/gloo/transport/"
      "tcp/pair.cc:538] Read error [127.0.0.1]:3739: Connection reset by "
      "peer"))
  assert chained.code == Code.DATA_LOSS
  assert "all-to-all failed" in chained.message
  other = error_status(RuntimeError("INVALID_ARGUMENT: Gloo AllReduce: "
                                    "unsupported dtype"))
  assert other.code == Code.INVALID_ARGUMENT


def test_a_ready_op_is_reported_by_its_caller_without_a_thread_hop(
    cpu_devices):
  """Arrays ready when added (a launch PJRT ran inline, a read of a finished
  array with a quick finish) are reported before add() returns, on the
  caller's thread; anything still pending, or with a finish that may wait,
  goes to the completion thread."""
  release = threading.Event()
  ready = jax.device_put(np.ones(2, np.float32), cpu_devices[0])
  ready.block_until_ready()
  reports, threads_seen = [], {}

  def report(seq, status, payload, waited):
    del waited
    reports.append((seq, status.code, bytes(payload)))
    threads_seen[seq] = threading.current_thread()

  completions = Completions(report)
  completions.add(1, [ready])
  completions.add(2, [ready], lambda: b"quick", quick=True)
  assert [r[0] for r in reports] == [1, 2]  # before add() returned
  completions.add(3, [ready], lambda: b"slow")  # may wait: not inline
  completions.add(4, [_Pending(release)])
  completions.add(5, [])  # nothing to tell it by: in order, on the thread
  release.set()
  completions.close()
  assert sorted(reports) == [(1, Code.OK, b""), (2, Code.OK, b"quick"),
                             (3, Code.OK, b"slow"), (4, Code.OK, b""),
                             (5, Code.OK, b"")]
  me = threading.current_thread()
  assert threads_seen[1] is me and threads_seen[2] is me
  assert all(threads_seen[s] is not me for s in (3, 4, 5))


def test_while_tracing_every_op_is_reported_in_order_by_the_thread(
    cpu_devices):
  """A trace's timings need reports in op order: a ready op added behind a
  pending one is not reported first by its caller."""
  release = threading.Event()
  ready = jax.device_put(np.ones(2, np.float32), cpu_devices[0])
  ready.block_until_ready()
  reports = []
  completions = Completions(
      lambda seq, status, payload, waited: reports.append(seq),
      tracing=lambda: True)
  completions.add(1, [_Pending(release)])
  completions.add(2, [ready])
  assert reports == []
  release.set()
  completions.close()
  assert reports == [1, 2]


def test_the_watchdog_reports_late_waits_awake_and_after_sleeping(
    monkeypatch):
  """It looks every period while waits are watched (no wake-up per watch)
  and sleeps once idle; a watch then wakes it, and is still reported."""
  monkeypatch.setattr(completions_lib, "WATCHDOG_PERIOD_S", 0.05)
  monkeypatch.setattr(completions_lib, "WATCHDOG_IDLE_S", 0.2)
  stuck = []
  watchdog = completions_lib._Watchdog(lambda seq, s: stuck.append((seq, s)))  # pylint: disable=protected-access

  def until(predicate):
    deadline = time.monotonic() + 5
    while not predicate() and time.monotonic() < deadline:
      time.sleep(0.01)
    return predicate()

  try:
    with watchdog.watching(1, 0.1):
      assert until(lambda: stuck == [(1, 0.1)])
    with watchdog.watching(2, 10.0):  # done in time: never reported
      pass
    assert until(lambda: watchdog._asleep)  # pylint: disable=protected-access
    with watchdog.watching(3, 0.1):
      assert until(lambda: (3, 0.1) in stuck)
    assert stuck == [(1, 0.1), (3, 0.1)]
  finally:
    watchdog.close()
