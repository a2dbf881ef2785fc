"""A cluster started as on real hosts (controller and workers from the CLI,
over loopback TCP) and client processes that talk JSON lines, for the
many-client benchmarks (B6, B7). Everything is killed on close."""
from __future__ import annotations

import json
import os
import select
import secrets
import signal
import subprocess
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


class Processes:
  """Controller, workers and clients of one run."""

  def __init__(self, islands: int, devices: int, controller: list[str] | None
               = None, simulate: int = 0):
    """simulate > 0: the islands are simulated (jax-pathways worker
    --simulate), at most `simulate` per worker process."""
    token = secrets.token_hex(16)
    self.env = dict(os.environ, JAX_PATHWAYS_TOKEN=token)
    self.env.pop("JAX_PLATFORMS", None)
    self.procs: list[subprocess.Popen] = []
    cli = [sys.executable, "-m", "jax_pathways.cli"]
    ctl = self._spawn((controller or cli) + [
        "controller", "--islands", str(islands), "--listen", "127.0.0.1:0",
        "--worker-listen", "127.0.0.1:0"])
    ready = json.loads(self.line(ctl, 60))
    self.controller_pid = int(ready["pid"])
    worker = cli + ["worker", "--controller", ready["worker_address"],
                    "--devices", str(devices)]
    if simulate:
      for first in range(0, islands, simulate):
        self._spawn(worker + ["--simulate",
                              str(min(simulate, islands - first))])
    else:
      for island in range(islands):
        self._spawn(worker + ["--island", str(island)])
    self.address = f"grpc://{ready['address']}"
    self.token = token
    self.env["JAX_PATHWAYS_ADDRESS"] = self.address

  def client(self, script: str, *args: str, ready_timeout: float = 180
             ) -> subprocess.Popen:
    """Starts benchmarks/`script` and waits for its {"ready": true}."""
    proc = self._spawn([sys.executable, os.path.join(HERE, script), *args],
                       stdin=True)
    msg = json.loads(self.line(proc, ready_timeout))
    assert msg.get("ready"), msg
    return proc

  def _spawn(self, argv: list[str], stdin: bool = False) -> subprocess.Popen:
    proc = subprocess.Popen(argv, env=self.env, cwd="/", text=True,
                            stdin=subprocess.PIPE if stdin else None,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL,
                            start_new_session=True)
    self.procs.append(proc)
    return proc

  @staticmethod
  def tell(proc: subprocess.Popen, line: str) -> None:
    proc.stdin.write(line + "\n")
    proc.stdin.flush()

  @staticmethod
  def line(proc: subprocess.Popen, timeout: float) -> str:
    """The process's next line; TimeoutError / RuntimeError if none."""
    if not select.select([proc.stdout], [], [], timeout)[0]:
      raise TimeoutError
    line = proc.stdout.readline()
    if not line:
      raise RuntimeError(f"process {proc.pid} exited ({proc.poll()})")
    return line

  def read(self, proc: subprocess.Popen, timeout: float) -> dict[str, Any]:
    return json.loads(self.line(proc, timeout))

  def close(self) -> None:
    for p in self.procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
    for p in self.procs:
      p.wait(timeout=10)
