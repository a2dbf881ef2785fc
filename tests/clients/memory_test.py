"""Device memory is budgeted: an upload that does not fit waits until
another client frees memory; one that can never fit, or that only its own
client could make room for, fails with the reason; nothing computed is
lost. A cluster of its own whose workers say they have 8 MiB per device
(32 MiB per island)."""
import json
import os
import select
import subprocess
import sys
import time

import pytest

from jax_pathways import admin, config
from jax_pathways.cluster.local_cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.multiprocess]

SCRIPT = os.path.join(os.path.dirname(__file__), "memory_client.py")


def _cluster(monkeypatch, **kwargs):
  monkeypatch.setenv(config.DEVICE_MEMORY, "8M")
  c = LocalCluster(islands=2, devices_per_island=4, max_in_flight=16, **kwargs)
  c.start()
  return c


@pytest.fixture
def cluster(monkeypatch):
  c = _cluster(monkeypatch)
  yield c
  c.stop()


@pytest.fixture
def impatient_cluster(monkeypatch):
  """Launches wait at most 1 s for memory (`--memory-wait 1`)."""
  c = _cluster(monkeypatch, memory_wait_s=1.0)
  yield c
  c.stop()


class Client:
  def __init__(self, cluster):
    env = dict(os.environ, **{config.ADDRESS: cluster.address,
                              config.TOKEN: cluster.token})
    env.pop("JAX_PLATFORMS", None)
    env.pop(config.DEVICE_MEMORY, None)
    self.proc = subprocess.Popen([sys.executable, SCRIPT], env=env, cwd="/",
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True)
    assert self.reply(90) == {"ready": True}

  def send(self, line):
    self.proc.stdin.write(line + "\n")
    self.proc.stdin.flush()

  def reply(self, timeout=60):
    if not select.select([self.proc.stdout], [], [], timeout)[0]:
      return None
    return json.loads(self.proc.stdout.readline())

  def kill(self):
    self.proc.kill()
    self.proc.wait(timeout=10)


def _island0(cluster):
  return admin.status(cluster.address, cluster.token)["islands"][0]


def test_uploads_wait_for_memory_and_fail_clearly(cluster):
  a, b = Client(cluster), Client(cluster)
  try:
    a.send("put 20")
    assert a.reply() == {"ok": 1}
    island = _island0(cluster)
    assert island["memory_capacity"] == 32 << 20
    assert island["memory_used"] == 20 << 20

    b.send("put 20")            # 20 + 20 > 32: waits for a to free memory
    assert b.reply(timeout=2) is None
    assert _island0(cluster)["queued"] >= 1
    a.send("drop")
    assert a.reply() == {"ok": 0}
    assert b.reply() == {"ok": 1}  # went as soon as a's arrays were deleted

    b.send("put 40")            # more than the island has
    msg = b.reply()["error"]
    assert "RESOURCE_EXHAUSTED" in msg
    assert "the results need 40.0 MiB on island 0" in msg
    assert "which has 32.0 MiB in all" in msg
    b.send("put 20")            # only b could make room, and it waits on it
    msg = b.reply()["error"]
    assert "this client's arrays already hold 20.0 MiB of its 32.0 MiB" in msg
    b.send("check")             # what b computed before is intact
    assert b.reply() == {"ok": True}
    a.send("put 8")             # and the cluster goes on serving
    assert a.reply() == {"ok": 1}
  finally:
    a.kill()
    b.kill()
  deadline = time.monotonic() + 20
  while _island0(cluster)["memory_used"] and time.monotonic() < deadline:
    time.sleep(0.2)
  assert _island0(cluster)["memory_used"] == 0  # the dead clients' memory


def test_a_wait_for_memory_is_bounded_by_the_controller_flag(
    impatient_cluster):
  a, b = Client(impatient_cluster), Client(impatient_cluster)
  try:
    a.send("put 20")
    assert a.reply() == {"ok": 1}
    start = time.monotonic()
    b.send("put 20")            # a never frees: b gives up after ~1 s
    msg = b.reply(timeout=30)["error"]
    assert time.monotonic() - start < 20
    assert "RESOURCE_EXHAUSTED" in msg
    assert "out of device memory on island 0" in msg
    assert "for other clients to free 20.0 MiB of its 32.0 MiB" in msg
    assert "(the controller's --memory-wait)" in msg
    b.send("put 8")             # what fits still goes
    assert b.reply() == {"ok": 1}
    a.send("check")
    assert a.reply() == {"ok": True}
  finally:
    a.kill()
    b.kill()
