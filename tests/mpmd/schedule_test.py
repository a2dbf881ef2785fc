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


def _times(plan, f, b):
  """Durations per mesh: `f[k]` / `b[k]` for the k-th mesh's F / B tasks."""
  return {mesh: [f[k] if t.kind == "F" else b[k] for t in tasks]
          for k, (mesh, tasks) in enumerate(plan.meshes.items())}


@pytest.mark.parametrize("make", [schedule.gpipe, schedule.one_f_one_b])
@pytest.mark.parametrize("stages", [2, 4])
def test_simulated_equal_stages_give_the_textbook_bubble(make, stages):
  names = [f"s{k}" for k in range(stages)]
  plan = make([f"m{k}" for k in range(stages)], names, 8)
  idle = schedule.simulate(plan, names,
                           _times(plan, [1.0] * stages, [2.0] * stages))
  assert idle == pytest.approx(
      dict.fromkeys(plan.meshes, schedule.bubble_fraction(stages, 8)))


def test_simulated_unequal_stages_idle_more():
  # Stage a's backward is 3 units, b's 4 (the first stage skips its input
  # gradient); F is 2. GPipe over 2 meshes, M = 8: b ends its last backward
  # at 2 + 16 + 32 = 50, a's last backward (3) ends at 53; a is busy
  # 16 + 24 = 40 of 53, b 16 + 32 = 48.
  plan = schedule.gpipe(["m0", "m1"], ["a", "b"], 8)
  idle = schedule.simulate(plan, ["a", "b"], _times(plan, [2, 2], [3, 4]))
  assert idle == pytest.approx({"m0": 13 / 53, "m1": 5 / 53})


def test_simulated_split_backward_waits_for_its_gradient():
  # One microbatch, two stages; m0's weight gradient (Bw) needs m0's Ba,
  # which needs m1's backward.
  plan = schedule.Schedule("split", {
      "m0": (schedule.Task("F", 0, ("a",)), schedule.Task("Ba", 0, ("a",)),
             schedule.Task("Bw", 0, ("a",))),
      "m1": (schedule.Task("F", 0, ("b",)), schedule.Task("B", 0, ("b",)))})
  idle = schedule.simulate(plan, ["a", "b"],
                           {"m0": [1, 1, 1], "m1": [1, 2]})
  # m0: F 0-1, waits for m1 (F 1-2, B 2-4), Ba 4-5, Bw 5-6.
  assert idle == pytest.approx({"m0": 0.5, "m1": 0.5})


def test_simulation_refuses_what_cannot_run():
  plan = schedule.Schedule("backwards", {
      "m0": (schedule.Task("B", 0, ("a",)), schedule.Task("F", 0, ("a",))),
      "m1": (schedule.Task("F", 0, ("b",)), schedule.Task("B", 0, ("b",)))})
  with pytest.raises(ValueError, match=r"schedule backwards never finishes: "
                     r"next tasks \{'m0': 'B0', 'm1': 'F0'\} wait for work "
                     r"no mesh runs before them"):
    schedule.simulate(plan, ["a", "b"], {"m0": [1, 1], "m1": [1, 1]})
  with pytest.raises(ValueError, match="mesh 'm1' runs 2 tasks but 1 "
                     "durations were given"):
    schedule.simulate(plan, ["a", "b"], {"m0": [1, 1], "m1": [1]})
