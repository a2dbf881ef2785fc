"""B7 at reduced size: many clients' collectives over overlapping device
sets that span islands, in random interleavings. Through jax_pathways: no
hang, no wrong result. Through per-worker FIFOs without gang order (a mode
of the benchmark only): wrong results or hangs, and none with one client."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.multiprocess]

BENCHMARK = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks",
                         "ordering_benchmark.py")


def _b7(*args):
  out = subprocess.run([sys.executable, BENCHMARK, *args],
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return [json.loads(line) for line in out.stdout.splitlines()
          if line.startswith("{")]


def test_gang_order_keeps_every_result_right():
  # The benchmark's full size (docs/benchmarks.md, B7): 2, 4 and 8 clients.
  for result in _b7("--clients", "4", "--rounds", "10"):
    assert result["rounds"] == 10, result
    assert (result["hangs"], result["wrong"], result["errors"]) == (0, 0, 0)
    assert result["programs"] == 10 * 6 * result["clients"]


def test_without_gang_order_clients_corrupt_each_other():
  alone, = _b7("--naive", "--clients", "1", "--rounds", "4")
  assert (alone["hangs"], alone["wrong"], alone["errors"]) == (0, 0, 0)
  # Stops at the first hang: a hung cluster is only good for killing.
  two, = _b7("--naive", "--clients", "2", "--rounds", "60", "--max-hangs",
             "1", "--round-timeout", "5")
  assert two["hangs"] + two["wrong"] > 0, two
