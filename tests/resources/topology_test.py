"""Islands join in any order; device ids follow island order."""
import pytest

from jax_pathways.resources.topology import Topology
from jax_pathways.status import StatusError


def _hello(island=None, n=4, pid=1):
  return {"island": island, "num_devices": n, "platform": "cpu",
          "device_kind": "cpu", "pid": pid, "host": "h", "data_address": "x:1"}


def test_device_ids_by_island_order():
  t = Topology(3)
  t.register(_hello(2, 2))
  t.register(_hello(0, 4))
  t.register(_hello(None, 3))  # takes the free island 1
  for i in range(3):
    t.connected(i)
  assert t.complete
  assert [list(i.device_ids) for i in t.islands()] == [
      [0, 1, 2, 3], [4, 5, 6], [7, 8]]
  assert t.island_of_device(5).id == 1
  assert [i.id for i in t.islands_of([8, 7], "x")] == [2]


def test_refusals():
  t = Topology(2)
  t.register(_hello(0))
  with pytest.raises(ValueError, match="already has a worker"):
    t.register(_hello(0, pid=9))
  with pytest.raises(ValueError, match="not in 0..1"):
    t.register(_hello(5))
  with pytest.raises(ValueError, match="devices"):
    t.register(_hello(1, n=0))
  with pytest.raises(ValueError, match="serialize_with_sdy='yes'"):
    t.register(dict(_hello(1), serialize_with_sdy="yes"))
  t.register(_hello(1))
  with pytest.raises(ValueError, match="already has its 2 islands"):
    t.register(_hello())


def test_islands_of_devices_in_island_order_and_unknown_devices_refused():
  t = Topology(2)
  t.register(_hello(0))
  t.register(_hello(1))
  assert [i.id for i in t.islands_of([4, 3], "the program")] == [0, 1]
  with pytest.raises(StatusError, match="device 8 does not exist"):
    t.islands_of([8], "the program")


def test_incomplete_cluster_says_what_is_missing_and_calls_back_once_complete():
  t = Topology(2)
  called = []
  t.register(_hello(0))
  t.connected(0)
  t.when_complete(lambda: called.append("early"))
  assert str(t.incomplete()) == (
      "only 1 of 2 island workers have joined the controller; start the "
      "missing workers (jax-pathways worker --controller ...)")
  assert not called
  t.register(_hello(1))
  t.connected(1)
  assert called == ["early"]
  t.when_complete(lambda: called.append("late"))
  assert called == ["early", "late"]


def test_a_lost_island_is_registered_again_as_its_next_generation():
  lost: set[int] = set()
  t = Topology(2, lambda: set(lost))
  t.register(_hello(0, 2))
  first = t.register(_hello(1, 3, pid=5))
  with pytest.raises(ValueError, match="already has a worker"):
    t.register(_hello(1, 3, pid=6))  # not lost: refused
  lost.add(1)
  with pytest.raises(ValueError, match="had 3 devices .* reports 2"):
    t.register(_hello(1, 2, pid=6))
  assert t.island_of_device(3) is first
  again = t.register(_hello(None, 3, pid=6))  # takes the lost island
  assert (again.id, again.generation, again.worker_pid) == (1, 1, 6)
  assert first.generation == 0
  # Global device ids do not change; they name the new worker's island.
  assert list(again.device_ids) == list(first.device_ids) == [2, 3, 4]
  assert t.island(1) is again
  assert t.island_of_device(3) is again
  t.abandon(again)  # it never connected: the lost worker's record again
  assert t.island_of_device(3) is first
  with pytest.raises(StatusError, match="device 5 does not exist"):
    t.island_of_device(5)


def test_one_new_worker_at_a_time_takes_a_lost_island():
  t = Topology(2, lambda: {1})
  t.register(_hello(0, 2))
  first = t.register(_hello(1, 2, pid=5))
  t.connected(0)
  t.connected(1)
  assert t.joining() == set()
  taking = t.register(_hello(1, 2, pid=6))
  assert t.joining() == {1}
  with pytest.raises(ValueError, match="already has a worker"):
    t.register(_hello(1, 2, pid=7))  # while pid 6 is joining
  t.abandon(taking)  # its connection failed: the place is free again
  assert t.island(1) is first and t.joining() == set()
  again = t.register(_hello(1, 2, pid=7))
  t.connected(1)
  assert (again.generation, again.worker_pid) == (1, 7)
  assert t.joining() == set()


def test_islands_share_one_platform():
  t = Topology(2)
  t.register(_hello(0))
  gpu = dict(_hello(1), platform="cuda", device_kind="NVIDIA H100")
  with pytest.raises(ValueError, match="island 1's worker runs on cuda, the "
                     "cluster's other islands on cpu"):
    t.register(gpu)
  assert t.register(_hello(1)).platform == "cpu"


def test_a_refused_worker_for_a_lost_island_leaves_its_place_free():
  t = Topology(2, lambda: {1})
  t.register(_hello(0, 2))
  first = t.register(_hello(1, 2, pid=5))
  for bad in ({"memory_bytes": -1}, {"host_memory_bytes": "lots"},
              {"serialize_with_sdy": "yes"}, {"custom_call_targets": 7}):
    with pytest.raises(ValueError, match="worker reports"):
      t.register(dict(_hello(1, 2, pid=6), **bad))
    assert t.island(1) is first and t.joining() == set()
  again = t.register(_hello(1, 2, pid=7))
  assert (again.generation, again.worker_pid) == (1, 7)
