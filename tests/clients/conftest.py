"""start_client: client processes of their own on the test cluster, read
with deadlines and always killed at the end."""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time

import pytest

from jax_pathways import config

SCRIPT = os.path.join(os.path.dirname(__file__), "client.py")


class ClientProcess:
  """A client.py process and its JSON lines."""

  def __init__(self, cluster, plan: dict, script: str = SCRIPT):
    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)
    env[config.ADDRESS] = cluster.address
    env[config.TOKEN] = cluster.token
    # Outside the checkout: `import jax_pathways` finds the installed one.
    self.proc = subprocess.Popen([sys.executable, script, json.dumps(plan)],
                                 env=env, cwd="/", stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    self.lines: list[dict] = []

  def read(self, key: str, timeout: float = 90.0) -> dict:
    """The next line that has `key`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
      if ready:
        line = self.proc.stdout.readline()
        if not line:
          break
        msg = json.loads(line)
        self.lines.append(msg)
        if key in msg:
          return msg
    raise AssertionError(f"no {key!r} from the client within {timeout} s; "
                         f"stderr ends:\n{self._stderr()[-3000:]}")

  def _stderr(self) -> str:
    self.kill()
    return self.proc.stderr.read()

  def kill(self) -> None:
    if self.proc.poll() is None:
      self.proc.kill()
    self.proc.wait(timeout=10)


@pytest.fixture
def start_client(pathways):
  started: list[ClientProcess] = []

  def start(script: str = SCRIPT, **plan) -> ClientProcess:
    client = ClientProcess(pathways, plan, script)
    started.append(client)
    return client

  yield start
  for client in started:
    client.kill()
