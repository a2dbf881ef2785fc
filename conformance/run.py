"""Runs JAX's own tests plain and through jax_pathways, and compares.

    python conformance/run.py                       # every pinned file
    python conformance/run.py array_test -k Sharding --json out.json
    python conformance/run.py --check               # vs known_failures.json

Each file runs twice, each time in a pytest process of its own: plain (JAX's
CPU backend with 8 host devices) and through jax_pathways (an embedded
cluster of 2 islands x 4 CPU devices; 'proxy' is the only backend). Per file
it prints: tests, passed plain, passed through jax_pathways, those that
pass plain but fail (or are skipped) through jax_pathways, grouped by cause
(the first line of the error, normalized), and those the pathways run never
reached. Nothing is fetched: the tests are the pinned copy in
conformance/jax_tests/.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterable, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS_DIR = os.path.join(HERE, "jax_tests")
KNOWN_FAILURES = os.path.join(HERE, "known_failures.json")
OUTPUT_ENV = "JAX_PATHWAYS_CONFORMANCE_OUT"  # recorder.OUTPUT_ENV

FILES = ("array_test", "multi_device_test", "random_test", "shard_map_test",
         "lax_control_flow_test", "lax_numpy_reducers_test", "api_test",
         "pjit_test", "lax_numpy_test", "debugging_primitives_test",
         "python_callback_test", "custom_partitioning_test",
         "shard_alike_test", "colocated_python_test")
MODES = ("plain", "pathways")


@dataclasses.dataclass
class Outcome:
  outcome: str  # passed failed error skipped xfailed xpassed
  message: str  # the error's (or skip's) first line


@dataclasses.dataclass
class Run:
  """One pytest process: each test's outcome, and whether it ran to the end."""
  outcomes: dict[str, Outcome]
  finished: bool
  seconds: float
  returncode: int | None


def _env(mode: str, cases: int, out: str) -> dict[str, str]:
  env = dict(os.environ)
  for key in ("JAX_PLATFORMS", "XLA_FLAGS", "JAX_NUM_CPU_DEVICES",
              "JAX_PATHWAYS_ADDRESS"):
    env.pop(key, None)
  env["JAX_NUM_GENERATED_CASES"] = str(cases)
  env[OUTPUT_ENV] = out
  if mode == "plain":
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["JAX_NUM_CPU_DEVICES"] = "8"
  return env


def _final(lines: list[dict]) -> Outcome:
  """A test's outcome from its setup/call/teardown lines."""
  kinds = [l["outcome"] for l in lines]
  for worst in ("failed", "error"):
    if worst in kinds:
      line = lines[kinds.index(worst)]
      return Outcome(worst, line["message"])
  call = [l for l in lines if l["when"] == "call"] or lines
  return Outcome(call[0]["outcome"], call[0]["message"])


def run_pytest(targets: Sequence[str], mode: str, keyword: str | None,
               cases: int, timeout_s: float, stem: str) -> Run:
  """One pytest process over pinned files (or file::Class); killed (its
  process group) at timeout_s, keeping the outcomes of the tests it
  finished. Leaves STEM.log, STEM.jsonl (outcomes) and STEM.meta.json."""
  out = stem + ".jsonl"
  open(out, "w", encoding="utf-8").close()
  cmd = [sys.executable, "-m", "pytest", "-q", "-c",
         os.path.join(HERE, "pytest.ini"), "--rootdir", HERE,
         "-p", "recorder"]
  if mode == "pathways":
    cmd += ["-p", "pathways_plugin"]
  if keyword:
    cmd += ["-k", keyword]
  for target in targets:
    name, sep, node = target.partition("::")
    cmd.append(os.path.join(TESTS_DIR, name + ".py") + sep + node)
  start = time.monotonic()
  with open(stem + ".log", "wb") as log:
    # From conformance/: `-m` puts the working directory first on the path,
    # so the plugins import as top-level modules, and jax_pathways is the
    # one this interpreter would import (not the checkout's, unbuilt).
    proc = subprocess.Popen(cmd, cwd=HERE, env=_env(mode, cases, out),
                            stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
      returncode: int | None = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      # The group is this pytest and what it forked; the cluster's processes
      # follow the controller, which watches this pytest's pid.
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
      returncode = None
  with open(stem + ".meta.json", "w", encoding="utf-8") as f:
    json.dump({"finished": returncode is not None,
               "seconds": round(time.monotonic() - start, 1),
               "returncode": returncode}, f)
  return load_run(stem)


def load_run(stem: str) -> Run:
  """A run_pytest() run from the files it left (STEM.jsonl, STEM.meta.json)."""
  lines: dict[str, list[dict]] = collections.defaultdict(list)
  with open(stem + ".jsonl", encoding="utf-8") as f:
    for text in f:
      line = json.loads(text)
      lines[line["test"].split("jax_tests/", 1)[-1]].append(line)
  with open(stem + ".meta.json", encoding="utf-8") as f:
    meta = json.load(f)
  return Run({test: _final(ls) for test, ls in lines.items()}, **meta)


def cause(message: str) -> str:
  """An error's first line with what varies between tests taken out, so
  that one cause groups many tests."""
  text = re.sub(r"\b0x[0-9a-fA-F]+|\d+",
                lambda m: "ADDR" if m[0].startswith("0x") else "N", message)
  text = re.sub(r"\s+", " ", text).strip()
  return text[:200] or "(no message)"


def compare(plain: Run, pathways: Run) -> dict:
  """One file's row: counts, and what passes plain but fails (or is
  skipped) through jax_pathways, grouped by cause. A test the pathways run
  never reached (its time limit) only counts as not run."""
  tests = sorted(set(plain.outcomes) | set(pathways.outcomes))
  passed_plain = [t for t in tests
                  if plain.outcomes.get(t, Outcome("", "")).outcome == "passed"]
  broken: dict[str, list[str]] = collections.defaultdict(list)
  kinds = collections.Counter()
  compared = [t for t in passed_plain if t in pathways.outcomes]
  for test in compared:
    got = pathways.outcomes[test]
    if got.outcome != "passed":
      kinds[got.outcome] += 1
      label = cause(got.message)
      if got.outcome == "skipped":
        label = "(skipped) " + label
      broken[label].append(test)
  return {
      "tests": len(tests),
      "passed_plain": len(passed_plain),
      "passed_pathways": sum(o.outcome == "passed"
                             for o in pathways.outcomes.values()),
      "failed_only_pathways": sum(len(v) for v in broken.values()),
      # Not reached: the pathways run hit its time limit first.
      "not_run_pathways": len(passed_plain) - len(compared),
      "by_outcome": dict(kinds),
      "finished": {"plain": plain.finished, "pathways": pathways.finished},
      "seconds": {"plain": plain.seconds, "pathways": pathways.seconds},
      "causes": dict(sorted(broken.items(), key=lambda kv: -len(kv[1]))),
      "compared_tests": compared,  # passed plain, ran through jax_pathways
  }


def _stem(log_dir: str, target: str, keyword: str | None, mode: str) -> str:
  name = target.replace("::", ".")
  if keyword:
    name += ".k" + hashlib.sha1(keyword.encode()).hexdigest()[:8]
  return os.path.join(log_dir, f"{name}.{mode}")


def run_files(selection: Iterable[tuple[str, str | None]], cases: int = 3,
              timeout_s: float = 1200, log_dir: str | None = None,
              progress: bool = True, reuse: bool = False) -> dict[str, dict]:
  """Each (file or file::Class, pytest -k or None) in both modes;
  {"target [-k keyword]": compare() row}. reuse: read the outcomes an
  earlier run left in log_dir instead of running pytest."""
  log_dir = log_dir or tempfile.mkdtemp(prefix="jax_pathways_conformance_")
  os.makedirs(log_dir, exist_ok=True)
  rows = {}
  for target, keyword in selection:
    name = _name(target, keyword)
    runs = {}
    for mode in MODES:
      stem = _stem(log_dir, target, keyword, mode)
      runs[mode] = load_run(stem) if reuse else run_pytest(
          [target], mode, keyword, cases, timeout_s, stem)
      if progress:
        print(f"  {name} {mode}: {len(runs[mode].outcomes)} tests in "
              f"{runs[mode].seconds} s"
              + ("" if runs[mode].finished else " (time limit)"),
              file=sys.stderr, flush=True)
    rows[name] = compare(runs["plain"], runs["pathways"])
  return rows


def run_together(selection: Iterable[tuple[str, str | None]], cases: int = 3,
                 timeout_s: float = 1200, log_dir: str | None = None
                 ) -> dict[str, dict]:
  """run_files' rows from one pytest process per mode for the whole
  selection: process and cluster start-up are paid once, not per entry
  (~8 s each), and the files share a process as in JAX's own CI. Each
  entry's -k applies to its own target only."""
  selection = list(selection)
  log_dir = log_dir or tempfile.mkdtemp(prefix="jax_pathways_conformance_")
  os.makedirs(log_dir, exist_ok=True)
  prefixes = [_prefix(target) for target, _ in selection]
  for a in prefixes:
    if any(b != a and b.startswith(a) for b in prefixes):
      raise ValueError(f"{a} holds another entry's tests: run them apart")
  # Positional targets keep collection to the entries' files and classes;
  # each clause names its file (and class) so that its -k leaves the other
  # entries' tests alone.
  keyword = " or ".join(_clause(target, kw) for target, kw in selection)
  runs = _both(lambda mode: run_pytest(
      [t for t, _ in selection], mode, keyword, cases, timeout_s,
      os.path.join(log_dir, f"all.{mode}")))
  rows = {}
  for (target, kw), prefix in zip(selection, prefixes):
    part = {mode: dataclasses.replace(run, outcomes={
        t: o for t, o in run.outcomes.items() if t.startswith(prefix)})
            for mode, run in runs.items()}
    rows[_name(target, kw)] = compare(part["plain"], part["pathways"])
  return rows


def _both(run: Callable[[str], Run]) -> dict[str, Run]:
  """run(mode) for each mode, side by side (the suite's selection): a run
  through jax_pathways waits on its cluster's processes about half the
  time, which the plain one fills."""
  with concurrent.futures.ThreadPoolExecutor(len(MODES)) as pool:
    futures = {mode: pool.submit(run, mode) for mode in MODES}
    return {mode: future.result() for mode, future in futures.items()}


def _name(target: str, keyword: str | None) -> str:
  return target + (f" -k {keyword!r}" if keyword else "")


def _clause(target: str, keyword: str | None) -> str:
  """`keyword` for `target`'s tests alone: "(file and Class and (kw))"."""
  name, _, node = target.partition("::")
  return "(" + " and ".join(filter(None, (
      name, node, f"({keyword})" if keyword else ""))) + ")"


def _prefix(target: str) -> str:
  """What the ids of `target`'s tests start with (as load_run keys them)."""
  name, _, node = target.partition("::")
  return f"{name}.py::" + (f"{node}::" if node else "")


def load_known(path: str = KNOWN_FAILURES) -> dict[str, str]:
  """{test: cause} from known_failures.json: {cause: {"why": the reason,
  "where": "jax client" (JAX refuses before it sends a request) |
  "controller" (jax_pathways answers with an error) | "result" (it runs and
  differs), "tests": [...]}}."""
  with open(path, encoding="utf-8") as f:
    data = json.load(f)
  return {test: label for label, entry in data.items()
          for test in entry["tests"]}


def update_known(rows: dict[str, dict], path: str = KNOWN_FAILURES) -> None:
  """Rewrites known_failures.json to this run's failures: tests this run
  ran are moved to their cause now (or dropped if they pass); others stay.
  A cause keeps its "why" and "where"; a new one gets "TODO" for both."""
  with open(path, encoding="utf-8") as f:
    data: dict[str, dict] = json.load(f)
  ran = {test for row in rows.values() for test in row["compared_tests"]}
  for entry in data.values():
    entry["tests"] = [t for t in entry["tests"] if t not in ran]
  for row in rows.values():
    for label, tests in row["causes"].items():
      data.setdefault(label, {"why": "TODO", "where": "TODO",
                              "tests": []})["tests"] += tests
  data = {label: {**entry, "tests": sorted(entry["tests"])}
          for label, entry in sorted(data.items()) if entry["tests"]}
  with open(path, "w", encoding="utf-8") as f:
    json.dump(data, f, indent=1)
    f.write("\n")


def check(rows: dict[str, dict],
          known: dict[str, str]) -> tuple[list[str], list[str]]:
  """(regressions, fixed): tests that pass plain and fail through
  jax_pathways without being listed, or for another cause than the one
  listed (a known failure that starts failing for a new reason is news),
  and listed ones that now pass (those among the tests this run ran and
  that pass plain)."""
  now = {test: label for row in rows.values()
         for label, tests in row["causes"].items() for test in tests}
  broken = set(now)
  regressions = sorted(
      test if test not in known else
      f"{test} (now: {now[test]}; listed: {known[test]})"
      for test in broken if known.get(test) != now[test])
  ran = {test for row in rows.values() for test in row["compared_tests"]}
  fixed = sorted(t for t in known if t in ran and t not in broken)
  return regressions, fixed


def print_table(rows: dict[str, dict]) -> None:
  head = ("file", "tests", "passed plain", "passed pathways",
          "failed only pathways", "not run pathways")
  print("| " + " | ".join(head) + " |")
  print("|" + "---|" * len(head))
  total = collections.Counter()
  for file, row in rows.items():
    cells = [row["tests"], row["passed_plain"], row["passed_pathways"],
             row["failed_only_pathways"], row["not_run_pathways"]]
    total.update(dict(zip(head[1:], cells)))
    note = "" if all(row["finished"].values()) else " (time limit)"
    print(f"| {file}{note} | " + " | ".join(map(str, cells)) + " |")
  print("| total | " + " | ".join(str(total[h]) for h in head[1:]) + " |")
  causes = collections.defaultdict(list)
  for file, row in rows.items():
    for label, tests in row["causes"].items():
      causes[label] += tests
  print("\nfailed only through jax_pathways, by cause:")
  for label, tests in sorted(causes.items(), key=lambda kv: -len(kv[1])):
    print(f"  {len(tests):5d}  {label}")


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("files", nargs="*", default=list(FILES),
                      help=f"pinned files, or file::Class (default: all of "
                      f"{FILES})")
  parser.add_argument("-k", dest="keyword", help="pytest -k, for every file")
  parser.add_argument("--cases", type=int, default=3,
                      help="JAX_NUM_GENERATED_CASES (default 3)")
  parser.add_argument("--timeout", type=float, default=1200,
                      help="seconds per pytest process (default 1200)")
  parser.add_argument("--json", help="write the rows here")
  parser.add_argument("--logs", help="keep pytest logs and outcomes here")
  parser.add_argument("--reuse", action="store_true",
                      help="no pytest: the table from what an earlier run "
                      "left in --logs")
  parser.add_argument("--check", action="store_true",
                      help="exit 1 on a failure not in known_failures.json, "
                      "or a listed one that now passes")
  parser.add_argument("--update-known", action="store_true",
                      help="rewrite known_failures.json to this run's "
                      "failures (tests not run keep their entries)")
  args = parser.parse_args(argv)
  files = [f.replace(".py", "") for f in args.files]
  for file in files:
    if file.partition("::")[0] not in FILES:
      parser.error(f"{file!r} is not pinned; conformance/jax_tests/ holds "
                   f"{', '.join(FILES)}")
  if args.reuse and not args.logs:
    parser.error("--reuse reads --logs DIR")
  rows = run_files([(f, args.keyword) for f in files], args.cases,
                   args.timeout, args.logs, reuse=args.reuse)
  print_table(rows)
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(rows, f, indent=1)
  if args.update_known:
    update_known(rows)
  if not args.check:
    return 0
  regressions, fixed = check(rows, load_known())
  for test in regressions:
    print(f"REGRESSION (not in known_failures.json): {test}")
  for test in fixed:
    print(f"now passes, remove from known_failures.json: {test}")
  return 1 if regressions or fixed else 0


if __name__ == "__main__":
  sys.exit(main())
