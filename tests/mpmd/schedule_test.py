"""Schedules as data: names, the textbook orders, the theoretical bubble."""
import pytest

from jax_pathways.mpmd import schedule


def test_names_are_checked_before_the_partitioner_sees_them():
  assert schedule.canonical("1f1b") == "1F1B"
  assert schedule.canonical("gpipe") == "GPipe"
  assert schedule.canonical("zero_bubble_h1") == "ZeroBubbleH1"
  with pytest.raises(ValueError, match="unknown pipeline schedule 'Wave'; "
                     "choose one of"):
    schedule.canonical("Wave")


def test_one_f_one_b_warms_up_then_alternates():
  plan = schedule.one_f_one_b(["m0", "m1", "m2", "m3"],
                              ["a", "b", "c", "d"], 8)
  assert plan.order("m0") == ("F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 "
                              "B7").split()
  assert plan.order("m3") == ("F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 "
                              "B7").split()
  assert plan.meshes["m1"][0] == schedule.Task("F", 0, ("b",))


def test_one_f_one_b_with_fewer_microbatches_than_stages():
  plan = schedule.one_f_one_b(["m0", "m1", "m2"], ["a", "b", "c"], 2)
  assert plan.order("m0") == ["F0", "F1", "B0", "B1"]
  assert plan.order("m2") == ["F0", "B0", "F1", "B1"]


def test_gpipe_and_the_bubble():
  plan = schedule.gpipe(["m0", "m1"], ["a", "b"], 4)
  assert plan.order("m1") == ["F0", "F1", "F2", "F3", "B0", "B1", "B2", "B3"]
  assert "m0: F0 F1 F2 F3 B0" in str(plan)
  assert schedule.bubble_fraction(4, 8) == pytest.approx(3 / 11)
  assert schedule.bubble_fraction(1, 8) == 0
