"""A cluster of CLI processes over TCP, as on real hosts, for tests that
kill and replace its workers; clients are subprocesses driven by stdin, one
JSON answer a line."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

from jax_pathways import admin

# Outside the checkout: `-m` / `-c` would import its unbuilt sources.
CWD = tempfile.gettempdir()


def spawn(*args: str, env: dict[str, str], stderr: Any = subprocess.PIPE
          ) -> subprocess.Popen:
  """`jax-pathways ARGS` in a session of its own (processes.stop ends it)."""
  return subprocess.Popen([sys.executable, "-m", "jax_pathways.cli", *args],
                          stdout=subprocess.PIPE, stderr=stderr, env=env,
                          text=True, start_new_session=True, cwd=CWD)


def start(env: dict[str, str], islands: int, procs: list[subprocess.Popen],
          *worker_args: str) -> dict[str, Any]:
  """A controller of `islands` islands and one worker (`jax-pathways worker
  WORKER_ARGS`) from the CLI, both added to `procs` for processes.stop;
  returns the controller's ready line."""
  controller = spawn("controller", "--islands", str(islands), "--listen",
                     "127.0.0.1:0", "--worker-listen", "127.0.0.1:0", env=env)
  procs.append(controller)
  ready = line(controller, 60)
  procs.append(spawn("worker", "--controller", ready["worker_address"],
                     *worker_args, env=env))
  return ready


def line(proc: subprocess.Popen, timeout: float) -> Any:
  """The next JSON line `proc` prints, within `timeout` seconds (other lines,
  such as Shardy's C++ log lines, are skipped)."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if select.select([proc.stdout], [], [], 0.2)[0]:
      text = proc.stdout.readline()
      if text.startswith("{"):
        return json.loads(text)
      if text:
        continue
    if proc.poll() is not None:
      break
  raise AssertionError(f"no line within {timeout} s; stderr ends:\n"
                       f"{stderr_of(proc)[-3000:]}")


def stderr_of(proc: subprocess.Popen) -> str:
  """What `proc` wrote to its stderr pipe (killing it first if it runs)."""
  if proc.poll() is None:
    os.killpg(proc.pid, signal.SIGKILL)
  return proc.stderr.read() if proc.stderr else ""


def island(address: str, token: str, number: int) -> dict[str, Any]:
  """Island `number` as `jax-pathways status` shows it."""
  return {i["island"]: i for i in admin.status(address, token)["islands"]}[
      number]


def wait_for(what: str, predicate: Callable[[], Any], timeout: float) -> Any:
  """predicate()'s first true value, polled until `timeout` seconds."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    value = predicate()
    if value:
      return value
    time.sleep(0.05)
  raise AssertionError(f"{what} within {timeout} s")
