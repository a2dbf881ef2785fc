"""Virtual slices: placed where the fewest clients are, within one island
when they fit, refused with the reason when they cannot fit; ids translate
both ways."""
import pytest

from jax_pathways.programs.sharding import Sharding
from jax_pathways.resources.resource_manager import ResourceManager
from jax_pathways.resources.topology import Topology
from jax_pathways.resources.virtual_slice import SliceRequest
from jax_pathways.status import StatusError


def _cluster(*sizes, lost=()):
  t = Topology(len(sizes))
  for i, n in enumerate(sizes):
    t.register({"island": i, "num_devices": n, "platform": "cpu",
                "device_kind": "cpu", "pid": i, "host": "h",
                "data_address": "x:1"})
    t.connected(i)
  return ResourceManager(t, lambda: set(lost))


def _ask(devices=None, island=None):
  return SliceRequest.parse(devices, island)


def test_slices_spread_over_the_least_held_devices():
  rm = _cluster(4, 4)
  assert rm.allocate(1, _ask("2")).physical_ids == (0, 1)
  assert rm.allocate(2, _ask("2")).physical_ids == (2, 3)
  assert rm.allocate(3, _ask("4")).physical_ids == (4, 5, 6, 7)
  assert rm.allocate(4, _ask("2", "1")).physical_ids == (4, 5)
  assert rm.allocate(1, _ask("8")).physical_ids == (0, 1)  # kept
  rm.release(3)
  rm.release(4)
  assert rm.allocate(5, _ask("3")).physical_ids == (4, 5, 6)
  assert rm.holders() == {0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1}


def test_whole_cluster_and_spanning_meshes():
  rm = _cluster(4, 4, 2)
  assert rm.allocate(1, _ask()).physical_ids == tuple(range(10))
  assert rm.allocate(2, _ask(island="2")).physical_ids == (8, 9)
  # 3x2: rows of 2 stay within an island; the least held islands first.
  assert rm.allocate(3, _ask("3x2")).physical_ids == (0, 1, 2, 3, 4, 5)
  with pytest.raises(StatusError, match="rows of 3 devices cannot be laid"):
    rm.check(_ask("3x3"))


def test_refusals_say_why():
  rm = _cluster(4, 4)
  with pytest.raises(StatusError, match="a slice of 9 devices does not fit: "
                     "the cluster has 8 devices in 2 islands"):
    rm.check(_ask("9"))
  with pytest.raises(StatusError, match="island 1 has 4 devices; leave "
                     "island unset"):
    rm.check(_ask("5", "1"))
  with pytest.raises(StatusError, match="island 3 does not exist"):
    rm.check(_ask("1", "3"))
  with pytest.raises(StatusError, match="a count .4. or a mesh shape"):
    _ask("four")
  with pytest.raises(StatusError, match="asks for no devices"):
    _ask("2x0")
  assert rm.holders() == {}  # checks place nothing


def test_ids_translate_both_ways():
  rm = _cluster(4, 4)
  s = rm.allocate(1, _ask("3", "1"))
  assert s.physical([0, 2]) == (4, 6) and s.virtual([6, 4]) == (2, 0)
  assert s.physical_sharding(Sharding((1, 2))).devices == (5, 6)
  assert s.virtual_sharding(Sharding((5,))).devices == (1,)
  with pytest.raises(StatusError, match="device 3 is not in this client's "
                     "slice: it has devices 0..2"):
    s.physical([3])


def test_slices_are_placed_on_islands_that_are_not_lost():
  rm = _cluster(4, 4, lost=[0])
  assert rm.allocate(1, _ask("4")).physical_ids == (4, 5, 6, 7)
  with pytest.raises(StatusError, match=r"islands \[0\] are lost"):
    rm.check(_ask("6"))
  # Asked for by name, or all devices: placed as asked, and its launches
  # there fail with the island's error.
  assert rm.allocate(2, _ask("4", "0")).physical_ids == (0, 1, 2, 3)
  assert len(rm.allocate(3, _ask()).physical_ids) == 8
