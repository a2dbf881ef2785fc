"""The examples run as a user runs them: a fresh process, its own cluster."""
import json
import os
import re
import subprocess
import sys

import pytest

import processes  # tests/conftest.py puts tests/ on sys.path

pytestmark = pytest.mark.integration

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def _tree_state() -> str | None:
  """`git status --porcelain` of the checkout (None outside one)."""
  out = subprocess.run(["git", "status", "--porcelain"], cwd=EXAMPLES,
                       capture_output=True, text=True, timeout=60)
  return out.stdout if out.returncode == 0 else None


_SLOW_START = "waiting for the workers to join the controller"


def _run(name, *args, quiet=True):
  """Its stdout; `quiet`: a healthy run, nothing at WARNING or above."""
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)
  before = _tree_state()
  # Run from the checkout's root, as the README does: an example writes
  # into a folder it prints, never into the working tree.
  out = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args],
                       env=env, capture_output=True, text=True, timeout=300,
                       cwd=os.path.dirname(EXAMPLES))
  assert out.returncode == 0, out.stderr[-3000:]
  assert _tree_state() == before, "the example changed the working tree"
  if quiet:
    # A slow start on a loaded machine says so (the workers took a while
    # to join): the machine's, not the example's, noise.
    loud = [line for line in out.stderr.splitlines()
            if processes.LOUD.match(line) and _SLOW_START not in line]
    assert not loud, out.stderr[-3000:]
  # What jaxlib's client logs by itself (stderr_filter.py) reads as a crash.
  for noise in ("Stack trace", "insecure client credentials"):
    assert noise not in out.stderr, out.stderr[-3000:]
  return out.stdout


def test_train_mlp():
  out = _run("train_mlp.py")
  assert "island 0: devices [0, 1, 2, 3]" in out
  assert "island 1: devices [4, 5, 6, 7]" in out
  losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", out)]
  assert len(losses) >= 9 and losses[-1] < 0.1 * losses[0]
  assert "accuracy 1.000" in out or float(
      re.search(r"accuracy (\d\.\d+)", out).group(1)) > 0.95


def test_data_parallel():
  out = _run("data_parallel.py")
  soup = re.search(r"averaged weights on island 0: \[([^\]]*)\]", out).group(1)
  assert [round(float(v)) for v in soup.split()] == list(range(1, 9))


def test_pipeline(tmp_path):
  trace = tmp_path / "step.json"
  out = _run("pipeline.py", str(trace))
  losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", out)]
  assert len(losses) >= 6 and losses[-1] < 0.1 * losses[0]
  assert "island0: F0 F1 F2 F3 B0 F4 B1" in out
  assert "island3: F0 B0 F1 B1" in out
  events = json.loads(trace.read_text())["traceEvents"]
  launches = [e for e in events if e.get("cat") == "launch"]
  assert {e["pid"] for e in launches} == {0, 1, 2, 3}
  assert (tmp_path / "step.svg").read_text().startswith("<svg")


def test_two_clients():
  out = _run("two_clients.py")
  islands = {}
  for name in ("alice", "bob"):
    losses = [float(v) for v in re.findall(rf"\[{name}\] step +\d+  loss "
                                           r"(\d+\.\d+)", out)]
    assert len(losses) == 6 and losses[-1] < 0.1 * losses[0], out
    mine = re.search(rf"\[{name}\] my devices: (.*)", out).group(1)
    assert mine.startswith("0 (island ") and "3 (island " in mine
    islands[name] = set(re.findall(r"island (\d)", mine))
  # Each asked for 4 devices: the least held ones, one island each.
  assert islands["alice"] != islands["bob"]
  assert all(len(v) == 1 for v in islands.values())
  assert "both done (exit codes [0, 0])" in out


def test_elastic():
  out = _run("elastic.py", quiet=False)  # it kills a worker of its own
  assert "step  22  killing island 1's worker (pid " in out
  assert "lost island(s) [1] at step " in out and "DATA_LOSS" in out
  assert "resumed from committed step 20 " in out
  assert "finished 60 steps on islands [0, 1]" in out
  assert "parameters bit-identical to an uninterrupted run: True" in out


def test_island_input():
  out = _run("island_input.py")
  assert "both loops agree: True" in out, out
  losses = [float(v) for v in re.findall(r"loss (\d+\.\d+) \(batches made",
                                         out)]
  assert len(losses) == 3 and losses[-1] < losses[0]
