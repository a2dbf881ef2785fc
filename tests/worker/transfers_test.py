"""Pulls between two PJRT clients of this process (two islands' worth):
launches wait for data that has not arrived, errors travel with the array,
a pull that never arrives is reported instead of waited on for ever, and
pulls from a sender declared lost fail at once."""
import threading
import time

import jax
import numpy as np
import pytest
from jax._src.lib import xla_client as xc

from jax_pathways import _core
from jax_pathways.status import Code, Status
from jax_pathways.worker.completions import Completions, error_status
from jax_pathways.worker.pjrt_backend import Execution
from jax_pathways.worker.transfers import Transfers, arrival


@pytest.fixture(scope="module")
def islands():
  """(transfers, device) of two clients, each with a transfer server."""
  out = []
  for _ in range(2):
    client = xc.make_cpu_client(asynchronous=True, num_devices=1)
    out.append((Transfers(client, "127.0.0.1"), client.local_devices()[0]))
  return out


def _aval(device, shape=(256,)):
  return jax.ShapeDtypeStruct(shape, np.float32,
                              sharding=jax.sharding.SingleDeviceSharding(device))


def _watched_completions():
  """Completions whose reports and stuck calls land in `reports`."""
  stuck, reports = threading.Event(), []
  completions = Completions(lambda *r: reports.append(r),
                            lambda seq, s: stuck.set() or reports.append(seq))
  return completions, stuck, reports


def test_a_launch_on_a_pulled_array_waits_for_its_bytes(islands):
  (sender, a), (receiver, b) = islands
  pulled = receiver.pull(11, 0, sender.address, _aval(b))
  doubled = jax.jit(lambda v: v * 2)(pulled)  # enqueued before data exists
  assert not pulled.is_ready() and not doubled.is_ready()
  source = np.arange(256, dtype=np.float32)
  sender.offer(11, jax.device_put(source, a), _aval(a))
  np.testing.assert_array_equal(np.asarray(doubled), source * 2)
  assert pulled.devices() == {b}


def test_a_failed_source_fails_the_pull_and_what_runs_on_it(islands):
  (sender, a), (receiver, b) = islands
  sender.offer(12, Status(Code.FAILED_PRECONDITION, "stage 0 ran out of x"),
               _aval(a))
  pulled = receiver.pull(12, 0, sender.address, _aval(b))
  after = jax.jit(lambda v: v + 1)(pulled)
  for array in (pulled, after):
    with pytest.raises(Exception,
                       match="FAILED_PRECONDITION: stage 0 ran out of x"):
      array.block_until_ready()


def test_a_pull_that_never_arrives_is_reported_stuck(islands):
  (sender, a), (receiver, b) = islands
  completions, stuck, reports = _watched_completions()
  pulled = receiver.pull(13, 0, sender.address, _aval(b))
  completions.add(7, [pulled], deadline_s=0.3)
  assert stuck.wait(10)
  assert reports == [7]
  # Let the blocked completion thread go (a worker would have exited).
  sender.offer(13, jax.device_put(np.zeros(256, np.float32), a), _aval(a))
  completions.close()
  assert [r[0] for r in reports[1:]] == [7]


def test_a_donated_pull_is_still_waited_for_and_watched(islands):
  # The fragment enqueued on a pulled array usually donates it; a donated
  # array reads as ready at once, so the worker waits on arrival() instead.
  (sender, a), (receiver, b) = islands
  completions, stuck, reports = _watched_completions()
  pulled = receiver.pull(17, 0, sender.address, _aval(b))
  landed = arrival(pulled)
  doubled = jax.jit(lambda v: v * 2, donate_argnums=0)(pulled)
  assert pulled.is_deleted() and not any(x.is_ready() for x in landed)
  completions.add(9, landed, deadline_s=0.3)
  assert stuck.wait(10)
  source = np.arange(256, dtype=np.float32)
  sender.offer(17, jax.device_put(source, a), _aval(a))
  np.testing.assert_array_equal(np.asarray(doubled), source * 2)
  completions.close()
  assert reports[0] == 9 and reports[1][0] == 9 and reports[1][1].ok


def test_a_launch_whose_output_a_later_launch_donates_is_waited_for(islands):
  """A backward that carries a gradient sum into the next one donates the
  previous backward's output, which then reads as ready at once; the worker
  waits on the launch's own completion (pjrt_backend.Execution) instead."""
  (sender, a), (receiver, b) = islands
  completions, _, reports = _watched_completions()
  pulled = receiver.pull(18, 0, sender.address, _aval(b))
  compiled = jax.jit(lambda v: v * 2).lower(_aval(b)).compile()
  results = compiled.runtime_executable().execute_sharded([pulled],
                                                          with_tokens=True)
  token = results.consume_token()
  (doubled,), = results.disassemble_into_single_device_arrays()
  execution = Execution(token, [doubled])
  after = jax.jit(lambda v: v + 1, donate_argnums=0)(doubled)
  assert doubled.is_deleted() and not execution.is_ready()
  completions.add(5, [execution])
  assert not sent_within(reports, 0.3)  # its input has not even arrived
  source = np.arange(256, dtype=np.float32)
  sender.offer(18, jax.device_put(source, a), _aval(a))
  np.testing.assert_array_equal(np.asarray(after), source * 2 + 1)
  completions.close()
  assert reports[0][0] == 5 and reports[0][1].ok


def sent_within(reports, seconds):
  """Whether a report came within `seconds`."""
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    if reports:
      return True
    time.sleep(0.01)
  return False


def test_a_cut_sender_fails_its_pulls_and_frees_the_device():
  """A stopped sender keeps its connection open and never offers: the launch
  enqueued on the pulled array holds the receiver's device (CPU launches run
  in order), later launches behind it. Once the sender's worker is declared
  lost, cut() ends its pulls: what waited on them fails as a broken link
  (DATA_LOSS for the user), the device runs on, and a new sender elsewhere
  is pulled from as before."""
  (sender, a), (receiver, b) = [
      (Transfers(c, "127.0.0.1"), c.local_devices()[0]) for c in
      [xc.make_cpu_client(asynchronous=True, num_devices=1) for _ in range(2)]]
  pulled = receiver.pull(21, 3, sender.address, _aval(b))
  after = jax.jit(lambda v: v + 1)(pulled)
  later = jax.jit(lambda v: v * 3)(jax.device_put(np.ones(4, np.float32), b))
  time.sleep(0.2)
  assert not after.is_ready() and not later.is_ready()
  receiver.cut(3)
  with pytest.raises(Exception) as failed:
    after.block_until_ready()
  status = error_status(failed.value)
  assert status.code == Code.DATA_LOSS, status
  assert status.message.startswith(_core.BROKEN_LINK), status
  np.testing.assert_array_equal(np.asarray(later), np.full(4, 3.0))
  replacement = Transfers(xc.make_cpu_client(asynchronous=True,
                                             num_devices=1), "127.0.0.1")
  source = np.arange(256, dtype=np.float32)
  replacement.offer(22, jax.device_put(source, a), _aval(a))
  np.testing.assert_array_equal(
      np.asarray(receiver.pull(22, 3, replacement.address, _aval(b))), source)
