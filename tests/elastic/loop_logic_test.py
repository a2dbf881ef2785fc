"""elastic.run's decisions, with the cluster faked: which islands are up is
scripted, a step raises a loss where the test says, and the steps run on
plain JAX CPU devices (two per 'island'). The real thing, with processes
killed and stopped, is loop_test.py."""
from __future__ import annotations

import threading

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, Mesh, PartitionSpec as P

from jax_pathways import elastic
from jax_pathways.elastic import islands as islands_lib


class FakeCluster:
  """Islands 0..3, two CPU devices each; `now` is the set that is up."""

  def __init__(self, cpu_devices, now):
    self.cpu = cpu_devices
    self.now = frozenset(now)

  def up(self) -> frozenset[int]:
    return self.now

  def devices(self, islands):
    return [d for i in islands for d in self.cpu[2 * i:2 * i + 2]]


@pytest.fixture
def cluster(monkeypatch, cpu_devices):
  def make(now):
    fake = FakeCluster(cpu_devices, now)
    monkeypatch.setattr(islands_lib, "up", fake.up)
    monkeypatch.setattr(islands_lib, "devices", fake.devices)
    monkeypatch.setattr(islands_lib, "POLL_S", 0.001)
    monkeypatch.setattr(islands_lib, "NOTICE_S", 0.2)
    return fake
  return make


def _setup(fail_at: dict[int, str], seen: list):
  """setup() whose step i raises `fail_at[i]` once (a JaxRuntimeError)."""
  def setup(devices):
    seen.append(len(devices))
    sharding = NamedSharding(Mesh(np.array(devices), ("d",)), P())
    advance = jax.jit(lambda s, i: s * 1.01 + i)

    def step(state, i):
      if i in fail_at:
        raise jax.errors.JaxRuntimeError(fail_at.pop(i))
      return advance(state, i), None
    return elastic.Plan(sharding, step)
  return setup


def _uninterrupted(steps: int, islands) -> np.ndarray:
  return np.asarray(elastic.run(_setup({}, []), STATE, steps,
                                islands=islands).state)


STATE = np.ones((4,), np.float32)


def test_a_loss_resumes_from_the_last_commit_on_the_islands_left(cluster):
  cluster({0})
  seen = []
  r = elastic.run(_setup({7: "DATA_LOSS: island 1 lost"}, seen), STATE, 12,
                  islands=[0, 1], commit_every=3, rejoin_timeout=0.01,
                  grow=False)
  assert r.step == 12 and r.islands == (0,)
  (e,) = r.events
  assert (e.kind, e.lost, e.failed_step, e.resumed_step, e.islands) == (
      "lost", (1,), 7, 6, (0,))
  assert e.steps_redone == 1 and "island 1 lost" in e.error
  assert e.detected_at <= e.islands_at <= e.placed_at <= e.resumed_at
  assert seen == [4, 2]  # set up again on the devices left
  np.testing.assert_array_equal(np.asarray(r.state), _uninterrupted(12, [0]))


def test_an_island_back_in_time_is_used_again(cluster):
  fake = cluster({0})
  back = threading.Timer(0.2, lambda: setattr(fake, "now", {0, 1}))
  back.start()
  r = elastic.run(_setup({4: "DATA_LOSS: gone"}, []), STATE, 8,
                  islands=[0, 1], commit_every=2, rejoin_timeout=30)
  assert r.islands == (0, 1) and r.events[0].islands == (0, 1)
  assert r.events[0].resumed_step == 4


def test_grows_back_at_a_commit(cluster):
  fake = cluster({0})

  def rejoin_at_5(step, _):
    if step == 5:
      fake.now = {0, 1}
  r = elastic.run(_setup({3: "DATA_LOSS: gone"}, []), STATE, 10,
                  islands=[0, 1], commit_every=2, rejoin_timeout=0.01,
                  on_step=rejoin_at_5)
  assert [(e.kind, e.islands, e.resumed_step) for e in r.events] == [
      ("lost", (0,), 2), ("grew", (0, 1), 6)]
  assert r.islands == (0, 1)
  np.testing.assert_array_equal(np.asarray(r.state), _uninterrupted(10, [0, 1]))


def test_a_loss_seen_before_the_controller_sees_it(cluster):
  """A spanning program fails in gloo as its peer dies, and the client may
  read that before the controller has seen the worker go: the loop waits a
  moment for the controller, then names the island."""
  fake = cluster({0, 1})

  def dies_soon(step, _):  # step 3 then fails before the controller knows
    if step == 3:
      threading.Timer(0.05, lambda: setattr(fake, "now", {0})).start()
  r = elastic.run(_setup({3: "DATA_LOSS: connection to a peer broke"}, []),
                  STATE, 6, islands=[0, 1], commit_every=2,
                  rejoin_timeout=0.01, grow=False, on_step=dies_soon)
  assert [(e.lost, e.islands) for e in r.events] == [((1,), (0,))]


def test_other_errors_are_the_callers(cluster):
  cluster({0, 1})
  with pytest.raises(jax.errors.JaxRuntimeError, match="INVALID_ARGUMENT"):
    elastic.run(_setup({2: "INVALID_ARGUMENT: bad"}, []), STATE, 5,
                islands=[0, 1])


def test_a_loss_with_every_island_up_twice_is_raised(cluster):
  cluster({0, 1})
  fail = {2: "DATA_LOSS: first"}
  setup = _setup(fail, [])

  def setup_failing_again(devices):
    fail[2] = "DATA_LOSS: again"  # the resumed step fails the same way
    return setup(devices)
  with pytest.raises(jax.errors.JaxRuntimeError, match="again"):
    elastic.run(setup_failing_again, STATE, 5, islands=[0, 1])


def test_too_few_islands_says_what_to_do(cluster):
  cluster({1})
  with pytest.raises(elastic.IslandsLost, match="min_islands=2"):
    elastic.run(_setup({1: "DATA_LOSS: gone"}, []), STATE, 5,
                islands=[0, 1], min_islands=2, rejoin_timeout=0.01,
                give_up_after=0.05)


def test_bad_arguments():
  with pytest.raises(ValueError, match="commit_every=0"):
    elastic.run(lambda d: None, STATE, 5, islands=[0], commit_every=0)
  with pytest.raises(ValueError, match="min_islands=3"):
    elastic.run(lambda d: None, STATE, 5, islands=[0, 1], min_islands=3)


def test_back_to_back_losses_are_two_events(cluster):
  """A second loss before the loop resumed from the first: each is an
  event of its own (there was one for both)."""
  fake = cluster({0, 1, 2})
  calls = [0]
  losses = {8: ({0, 1}, "DATA_LOSS: island 2 lost"),
            9: ({0}, "DATA_LOSS: island 1 lost")}

  def setup(devices):
    sharding = NamedSharding(Mesh(np.array(devices), ("d",)), P())
    advance = jax.jit(lambda s, i: s * 1.01 + i)

    def step(state, i):
      calls[0] += 1
      if calls[0] in losses:
        fake.now, why = losses.pop(calls[0])
        fake.now = frozenset(fake.now)
        raise jax.errors.JaxRuntimeError(why)
      return advance(state, i), None
    return elastic.Plan(sharding, step)

  seen = []
  r = elastic.run(setup, STATE, 12, islands=[0, 1, 2], commit_every=3,
                  rejoin_timeout=0.01, grow=False, on_event=seen.append)
  assert r.step == 12 and r.islands == (0,)
  first, second = r.events
  assert (first.lost, first.islands, first.resumed_at) == ((2,), (0, 1), 0.0)
  assert "island 2 lost" in first.error
  assert (second.lost, second.islands) == ((1,), (0,))
  assert "island 1 lost" in second.error
  assert second.resumed_at != 0.0  # the loop resumed from this one
  assert seen == [first, second]
  np.testing.assert_array_equal(np.asarray(r.state), _uninterrupted(12, [0]))
