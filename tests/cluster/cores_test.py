"""cluster/cores.py: core lists, dealing cores to islands, pinning."""
import os
import threading

import pytest

from jax_pathways.cluster import cores


def test_parse_and_format():
  assert cores.parse("0,2,4-7") == [0, 2, 4, 5, 6, 7]
  assert cores.parse("3, 1") == [1, 3]
  assert cores.format_list([3, 1]) == "1,3"
  for bad in ("", "a", "3-1", "-2", "1,,2"):
    with pytest.raises(ValueError, match="cores"):
      cores.parse(bad)


def test_deal():
  assert cores.deal(2, [0, 1]) == [[0], [1]]
  assert cores.deal(4, [0, 1]) == [[0], [1], [0], [1]]
  assert cores.deal(2, [0, 1, 2, 3, 4]) == [[0, 1], [2, 3]]
  assert cores.deal(3, [4, 5, 6, 7, 8, 9]) == [[4, 5], [6, 7], [8, 9]]
  with pytest.raises(ValueError):
    cores.deal(2, [])


def test_pinned_keeps_threads_started_inside_and_restores_the_caller():
  before = os.sched_getaffinity(0)
  one = min(before)
  seen = {}

  def record():
    seen["thread"] = os.sched_getaffinity(0)

  with cores.pinned([one]):
    assert os.sched_getaffinity(0) == {one}
    t = threading.Thread(target=record)
    t.start()
    t.join(timeout=10)
  assert seen["thread"] == {one}
  assert os.sched_getaffinity(0) == before
  with cores.pinned(None):
    assert os.sched_getaffinity(0) == before


def test_pinned_to_a_core_this_process_may_not_use():
  absent = max(os.sched_getaffinity(0)) + 1000
  with pytest.raises(ValueError, match=f"cores {absent} are not available"):
    with cores.pinned([absent]):
      pass
