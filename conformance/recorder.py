"""pytest plugin: one JSON line per test outcome, written as each test ends.

Written line by line (not at session end) so that a run killed at its time
limit still leaves the outcomes of the tests it finished.
"""
from __future__ import annotations

import json
import os

import pytest

# conformance/run.py names the file; without it the plugin records nothing.
OUTPUT_ENV = "JAX_PATHWAYS_CONFORMANCE_OUT"


def _first_line(report: pytest.TestReport) -> str:
  crash = getattr(report.longrepr, "reprcrash", None)
  if crash is not None:
    text = crash.message
  elif isinstance(report.longrepr, tuple):  # a skip: (path, line, reason)
    text = report.longrepr[2]
  else:
    text = str(report.longrepr or "")
  return text.strip().splitlines()[0] if text.strip() else ""


class Recorder:

  def __init__(self, path: str) -> None:
    self._file = open(path, "a", encoding="utf-8")  # pylint: disable=consider-using-with

  def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
    # A test's outcome is its call's, unless setup or teardown went wrong
    # (then an 'error'), or setup skipped it.
    if report.when == "call" or report.outcome != "passed":
      outcome = report.outcome
      if hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
      elif report.when != "call" and report.failed:
        outcome = "error"
      line = {"test": report.nodeid, "when": report.when, "outcome": outcome,
              "message": "" if report.passed else _first_line(report),
              "duration": round(report.duration, 3)}
      self._file.write(json.dumps(line) + "\n")
      self._file.flush()

  def pytest_unconfigure(self) -> None:
    self._file.close()


def pytest_configure(config: pytest.Config) -> None:
  path = os.environ.get(OUTPUT_ENV)
  if path:
    config.pluginmanager.register(Recorder(path), "conformance_recorder")
