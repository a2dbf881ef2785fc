"""Pipeline training over 4 islands (a cluster of its own, in a subprocess)."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

SCRIPT = os.path.join(os.path.dirname(__file__), "four_islands.py")


def test_gpipe_and_1f1b_over_four_islands():
  out = subprocess.run([sys.executable, SCRIPT, "GPipe", "1F1B"],
                       capture_output=True, text=True, timeout=280,
                       env={k: v for k, v in os.environ.items()
                            if not k.startswith("JAX_PATHWAYS_")})
  assert out.returncode == 0, out.stderr[-4000:]
  runs = [json.loads(line) for line in out.stdout.splitlines()
          if line.startswith("{")]
  assert [r["schedule"] for r in runs] == ["GPipe", "1F1B"]
  for run in runs:
    assert run["partitioner"] == "shardy"
    for got, want in zip(run["losses"], run["reference"]):
      assert abs(got - want) <= 1e-5 * abs(want), run
    assert run["param_error"] <= 1e-5, run
    assert run["islands"] == [0, 1, 2, 3]
  gpipe, one_f_one_b = runs[0]["order"], runs[1]["order"]
  assert gpipe["island3"] == [f"F{i}" for i in range(8)] + [
      f"B{i}" for i in range(8)]
  assert one_f_one_b["island0"][:6] == ["F0", "F1", "F2", "F3", "B0", "F4"]
  assert one_f_one_b["island3"][:4] == ["F0", "B0", "F1", "B1"]
