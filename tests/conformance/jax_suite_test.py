"""JAX's own tests (conformance/jax_tests/) plain and through jax_pathways.

A reduced selection runs in every integration run: a test that passes plain
must pass through jax_pathways unless conformance/known_failures.json lists
it, and a listed one that passes fails this test too, so that the list
shrinks as causes get fixed. conformance/run.py runs the full files.
"""
from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
from conformance import run  # noqa: E402  pylint: disable=wrong-import-position

# (file or file::Class, pytest -k): arrays and shardings, multi-device jit,
# shard_map, control flow, random keys; ~180 tests each way, one pytest
# process each way, ~100 s on two shared cores (docs/conformance.md).
SELECTION = (
    ("multi_device_test", None),
    ("array_test::JaxArrayTest", "device_put or jnp_array or buffer_protocol "
     "or array_2d_shard or addressable or delete"),
    ("shard_map_test::ShardMapTest", "all_gather or axis_index or eager or "
     "debug_print or psum or ppermute"),
    ("lax_control_flow_test::LaxControlFlowTest",
     "(testCond and not Grad and not JVP and not Linearize) or testForiLoop "
     "or testScanImpl or testWhileLoopBatched or testSwitchJit"),
    ("random_test::KeyArrayTest", "device_put or cpp_dispatch or key_copy or "
     "delete or async"),
    # One test or more per cause the controller answers: tokens, RemapArrays,
    # donation reporting.
    ("api_test::JitTest", "token"),
    ("pjit_test", "device_put_donate_pytree or efficient_reshard_single_host "
     "or BufferDonation"),
    # Callbacks of every kind: printing (ordered too) under transformations
    # and in pmap, pure/io callbacks and their errors, custom partitioning,
    # inspect_array_sharding.
    ("debugging_primitives_test::DebugPrintTest", "jit or ordered"),
    ("debugging_primitives_test::DebugPrintControlFlowTest", "scan or cond"),
    ("debugging_primitives_test::DebugPrintParallelTest", None),
    ("debugging_primitives_test::InspectShardingTest", None),
    ("python_callback_test::PythonCallbackTest",
     "scalar or pytree or error or cond or while_loop"),
    ("python_callback_test::IOCallbackTest", "ordered"),
    ("custom_partitioning_test", None),
    ("shard_alike_test", "grad or shard_map"),  # grad inspects shardings
    # Functions run beside the islands: specs discovered, objects, strings.
    ("colocated_python_test", None),
)


def _row(plain: dict[str, str], pathways: dict[str, tuple[str, str]]) -> dict:
  return run.compare(
      run.Run({t: run.Outcome(o, "") for t, o in plain.items()}, True, 0, 0),
      run.Run({t: run.Outcome(*o) for t, o in pathways.items()}, True, 0, 0))


def test_cause_groups_what_varies():
  assert (run.cause("ValueError: shape (8, 2) at 0x7f3a  handle=12") ==
          run.cause("ValueError: shape (4, 4) at 0x55aa handle=7") ==
          "ValueError: shape (N, N) at ADDR handle=N")


def test_compare_counts_only_tests_that_pass_plain():
  row = _row({"a": "passed", "b": "passed", "c": "failed", "d": "passed"},
             {"a": ("passed", ""), "b": ("failed", "E: x 1"),
              "c": ("failed", "E: y")})
  assert (row["tests"], row["passed_plain"], row["passed_pathways"],
          row["failed_only_pathways"], row["not_run_pathways"]) == (
              4, 3, 1, 1, 1)
  assert row["causes"] == {"E: x N": ["b"]}


def test_check_reports_regressions_and_fixes():
  rows = {"f": _row({"a": "passed", "b": "passed", "c": "passed",
                     "d": "passed"},
                    {"a": ("failed", "E"), "b": ("passed", ""),
                     "c": ("failed", "E"), "d": ("failed", "F")})}
  # z: not run here, stays quiet; d: listed, but fails for a new reason.
  known = {"c": "E", "b": "E", "z": "E", "d": "E"}
  assert run.check(rows, known) == (
      ["a", "d (now: F; listed: E)"], ["b"])


def test_known_failures_file_is_well_formed():
  with open(run.KNOWN_FAILURES, encoding="utf-8") as f:
    data = json.load(f)
  seen = set()
  for label, entry in data.items():
    assert entry["why"] and entry["why"] != "TODO", label
    assert entry["where"] in ("jax client", "controller", "result"), label
    assert not seen & set(entry["tests"]), f"listed twice under {label}"
    seen |= set(entry["tests"])


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_selection_fails_only_as_known(tmp_path):
  rows = run.run_together(SELECTION, cases=3, timeout_s=600,
                          log_dir=str(tmp_path))
  for file, row in rows.items():
    assert all(row["finished"].values()), (
        f"{file} hit its time limit: {row['seconds']}; logs in {tmp_path}")
    assert row["passed_plain"] > 0, f"{file}: nothing passed plain"
    # A pathways run that dies early (a cluster that never starts) leaves
    # its tests unrun, which check() does not count.
    assert row["not_run_pathways"] == 0, (
        f"{file}: {row['not_run_pathways']} tests never ran through "
        f"jax_pathways; logs in {tmp_path}")
  regressions, fixed = run.check(rows, run.load_known())
  causes = {test: label for row in rows.values()
            for label, tests in row["causes"].items() for test in tests}
  assert not regressions, (
      "pass plain, fail through jax_pathways (not in "
      "conformance/known_failures.json, or for another cause):\n" +
      "\n".join(f"  {t}: {causes.get(t, '')}" for t in regressions))
  assert not fixed, (
      "now pass through jax_pathways; remove them from "
      "conformance/known_failures.json (python conformance/run.py "
      "--update-known):\n" + "\n".join(f"  {t}" for t in fixed))
