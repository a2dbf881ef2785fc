"""Callbacks of several clients at once: each client's callbacks run in its
own process, never another's; a client killed while its callback is
pending holds no island, and the controller forgets what it owed."""
import os
import signal
import time

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jax_pathways import admin

pytestmark = [pytest.mark.integration, pytest.mark.multiprocess]

SCRIPT = os.path.join(os.path.dirname(__file__), "callback_client.py")
WAIT_S = 60.0  # only catches hangs


def _callbacks(pathways) -> dict:
  return admin.status(pathways.address, pathways.token)["callbacks"]


def _worker_pids(pathways) -> list[int]:
  return [i["pid"] for i in
          admin.status(pathways.address, pathways.token)["islands"]]


def _run_here(proxy_devices, ids, offset: float) -> None:
  """This process's own program with callbacks on `ids`, checked."""
  mesh = Mesh(np.array([proxy_devices[i] for i in ids]), ("d",))
  f = jax.jit(lambda x: jax.pure_callback(
      lambda v: v + np.float32(offset), jax.ShapeDtypeStruct(x.shape,
                                                             x.dtype), x))
  x = np.arange(8 * len(ids), dtype=np.float32)
  got = np.asarray(f(jax.device_put(x, NamedSharding(mesh, P("d")))))
  np.testing.assert_array_equal(got, x + offset)


def test_each_clients_callbacks_run_in_its_own_process(start_client,
                                                       pathways,
                                                       proxy_devices):
  # Two clients on the same island's devices and one across both islands,
  # each with its own secret: a callback run by the wrong process would add
  # the wrong one.
  plans = [dict(mode="steps", secret=1.0, steps=20, devices=[0, 1, 2, 3]),
           dict(mode="steps", secret=2.0, steps=20, devices=[0, 1, 2, 3]),
           dict(mode="steps", secret=3.0, steps=20, devices=list(range(8)))]
  clients = [start_client(script=SCRIPT, **plan) for plan in plans]
  for _ in range(5):  # and this process, meanwhile
    _run_here(proxy_devices, [4, 5, 6, 7], 7.0)
  for client, plan in zip(clients, plans):
    done = client.read("done", WAIT_S)
    steps = [m for m in client.lines if "step" in m]
    assert [m["ok"] for m in steps] == [True] * plan["steps"]
    assert done["done"] == plan["steps"]  # one debug callback per step


@pytest.mark.parametrize("devices", [[5], [0, 1, 2, 3], list(range(8))],
                         ids=["one_device", "one_island", "both_islands"])
def test_a_client_killed_in_its_callback_holds_no_island(start_client,
                                                         pathways,
                                                         proxy_devices,
                                                         devices):
  workers = _worker_pids(pathways)
  routes = _callbacks(pathways)["routes"]  # this process's programs'
  client = start_client(script=SCRIPT, mode="block", devices=devices)
  client.read("blocked", WAIT_S)
  assert _callbacks(pathways)["pending"] == 1
  os.kill(client.proc.pid, signal.SIGKILL)
  client.proc.wait(timeout=WAIT_S)
  # What it owed is failed at once; its launch ends, and the island takes
  # this process's programs on the same devices.
  deadline = time.monotonic() + WAIT_S
  while _callbacks(pathways)["pending"] and time.monotonic() < deadline:
    time.sleep(0.05)
  assert _callbacks(pathways)["pending"] == 0
  _run_here(proxy_devices, devices, 1.0)
  assert _worker_pids(pathways) == workers  # no worker died of it
  # Its session's programs and routes are forgotten once it is gone.
  while (_callbacks(pathways)["routes"] > routes and
         time.monotonic() < deadline):
    time.sleep(0.05)
  assert _callbacks(pathways)["routes"] <= routes
