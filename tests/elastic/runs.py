"""A training client run in a process of its own (training_run.py), and
what every elastic loss must look like: loop_test.py's and
capped_client_test.py's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import processes

RUN = os.path.join(os.path.dirname(__file__), "training_run.py")
WORKER_TIMEOUT = 2.0  # seconds of silence before a worker is lost


def train(settings: dict, timeout: float = 240.0,
          env: dict | None = None, stack_kib: int | None = None) -> dict:
  """Runs training_run.py (with `env` added to this process's, and
  `ulimit -s stack_kib`: its threads' stacks); its result. Every pid it
  hurt is gone after."""
  command = [sys.executable, RUN, json.dumps(settings)]
  if stack_kib is not None:
    command = ["bash", "-c", f'ulimit -s {stack_kib} && exec "$@"', "bash",
               *command]
  proc = subprocess.Popen(
      command, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, start_new_session=True,
      cwd=tempfile.gettempdir(), env=dict(os.environ, **(env or {})))
  try:
    out, err = proc.communicate(timeout=timeout)
  finally:
    processes.stop([proc])
  assert proc.returncode == 0, err[-4000:]
  result = json.loads(out.strip().splitlines()[-1])
  for h in result["hurt"]:  # only the very process it hurt, if it lives
    started = processes.started(h["pid"])
    if started is not None and started == h["started"]:
      os.kill(h["pid"], 9)
  return result


def check_lost(event: dict, island: int, commit_every: int) -> None:
  assert event["kind"] == "lost"
  assert island in event["lost"], event
  assert "DATA_LOSS" in event["error"], event
  # Resumed from the last commit: no committed step lost.
  assert event["resumed_step"] % commit_every == 0, event
  assert 0 <= event["failed_step"] - event["resumed_step"] <= (
      commit_every + 16), event  # 16: launches in flight before the error
