"""A worker reports an op as done even when a later op already consumed
one of its arrays (a donating launch): failing it would poison its other
results, which are fine."""
import threading

import jax
import numpy as np

from jax_pathways.status import Code
from jax_pathways.worker.completions import Completions


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
  """The trace needs it: an op found done was done some time before."""
  release = threading.Event()
  ready = jax.device_put(np.ones(2, np.float32), cpu_devices[0])
  ready.block_until_ready()
  reports, done = {}, threading.Event()

  def report(seq, status, payload, waited):
    del status, payload
    reports[seq] = waited
    if len(reports) == 2:
      done.set()

  completions = Completions(report)
  completions.add(1, [_Pending(release)])
  completions.add(2, [ready])
  threading.Timer(0.2, release.set).start()
  assert done.wait(10)
  completions.close()
  assert reports == {1: True, 2: False}
