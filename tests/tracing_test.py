"""jax_pathways.trace(): which ops each island ran, in what order, when."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_pathways
from jax_pathways import admin

pytestmark = pytest.mark.integration


def test_trace_records_each_islands_launches_in_order(proxy_devices,
                                                      tmp_path):
  def scaled_square(x):
    return x * x * 0.5

  def shifted(x):
    return x + 1.0

  f, g = jax.jit(scaled_square), jax.jit(shifted)
  a = jax.device_put(jnp.ones((64, 64)), proxy_devices[0])
  b = jax.device_put(jnp.ones((64, 64)), proxy_devices[4])
  f(a).block_until_ready(), g(b).block_until_ready()  # compiled outside

  path = tmp_path / "trace.json"
  with jax_pathways.trace(str(path)) as t:
    for _ in range(3):
      a = f(a)
      b = g(b)
    a.block_until_ready(), b.block_until_ready()

  names = {island: [op.name for op in t.launches(island)]
           for island in (0, 1)}
  assert names == {0: ["jit_scaled_square"] * 3, 1: ["jit_shifted"] * 3}
  for island in (0, 1):
    ops = [op for op in t.ops if op.island == island]
    assert [op.seq for op in ops] == sorted(op.seq for op in ops)
    for op in ops:
      assert op.issued_ns <= op.issue_end_ns
      assert op.issued_ns <= op.start_ns <= op.ready_ns
    launches = t.launches(island)
    for earlier, later in zip(launches, launches[1:]):  # one after another
      assert earlier.ready_ns <= later.start_ns
  assert all(0.0 < u <= 1.0 for u in t.utilization().values())
  np.testing.assert_array_equal(np.asarray(b), np.full((64, 64), 4.0))

  chrome = json.loads(path.read_text())
  boxes = [e for e in chrome["traceEvents"] if e["ph"] == "X"]
  assert len(boxes) == len(t.ops)
  assert {e["pid"] for e in boxes} == {0, 1}
  assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in boxes)


def test_nothing_is_recorded_outside_a_trace(proxy_devices):
  f = jax.jit(lambda x: x - 1)
  x = jax.device_put(jnp.zeros(8), proxy_devices[0])
  f(x).block_until_ready()
  with jax_pathways.trace() as t:
    pass
  assert not t.launches(0)


def test_trace_rejects_an_unknown_action(pathways):
  address, token = jax_pathways._initialize.connection()  # pylint: disable=protected-access
  with pytest.raises(admin.AdminError,
                     match="trace action must be one of .*'pause'"):
    admin.trace(address, "pause", token)
  assert admin.status(address, token)["complete"]


def test_a_launch_starts_after_the_data_received_before_it():
  """A launch may be issued before its pulled input arrives; its time
  counts from the later of that and the island's previous launch."""
  from jax_pathways.tracing import Trace  # pylint: disable=import-outside-toplevel
  t = Trace()
  t.fill({"islands": {"1": [
      [1, "launch", "f", 100, 101, 200],    # runs 100..200
      [2, "receive", "receive", 110, 111, 500],
      [3, "launch", "g", 120, 121, 650],    # issued at 120, data at 500
      [4, "launch", "h", 130, 131, 700],    # after g
  ]}})
  assert [(op.start_ns, op.ready_ns) for op in t.launches(1)] == [
      (100, 200), (500, 650), (650, 700)]
  assert t.utilization() == {1: pytest.approx((100 + 150 + 50) / 600)}


def test_a_receive_found_done_counts_from_the_previous_launchs_end():
  """A worker notices a receive only after reporting the launch before it;
  if it was done by then (waited False), its bytes count as there when that
  launch ended, so the next launch shows no wait it did not have."""
  from jax_pathways.tracing import Trace  # pylint: disable=import-outside-toplevel
  t = Trace()
  t.fill({"islands": {"0": [
      [1, "launch", "f", 100, 101, 200, True],
      [2, "receive", "pull", 110, 111, 203, False],   # noticed at 203
      [3, "launch", "g", 120, 121, 300, True],
      [4, "receive", "pull", 130, 131, 350, True],    # really came at 350
      [5, "launch", "h", 140, 141, 400, True],
  ]}})
  assert [(op.start_ns, op.ready_ns) for op in t.launches(0)] == [
      (100, 200), (200, 300), (350, 400)]
