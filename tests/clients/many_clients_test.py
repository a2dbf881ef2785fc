"""Several client processes on one controller: each on its virtual slice,
all correct at once; a slice that cannot fit is refused clearly; a client
killed mid-step leaves the others running and its memory freed."""
import time

import jax
import numpy as np
import pytest

from jax_pathways import admin

pytestmark = [pytest.mark.integration, pytest.mark.multiprocess]


def _status(pathways):
  return admin.status(pathways.address, pathways.token)


def test_clients_run_at_once_on_their_slices(start_client, pathways,
                                             proxy_devices):
  clients = [start_client(devices=2, island=1, steps=30, seed=1),
             start_client(devices=[2, 2], steps=30, seed=2),
             start_client(devices=6, steps=30, seed=3)]
  placed = [c.read("devices") for c in clients]
  # Every client sees devices 0..n-1; the controller says where they are.
  assert [p["devices"] for p in placed] == [[0, 1], [0, 1, 2, 3],
                                            list(range(6))]
  assert placed[0]["islands"] == [1, 1]
  assert placed[0]["physical"][0] >= 4  # island 1's devices are 4..7
  assert len(set(placed[1]["islands"])) == 1  # 4 devices fit one island
  assert sorted(set(placed[2]["islands"])) == [0, 1]  # 6 span both

  # While they run, this process (a client of the whole cluster) runs too.
  f = jax.jit(lambda a: (a * 2.0).sum())
  x = np.arange(64, dtype=np.float32)
  for _ in range(20):
    assert float(f(jax.device_put(x, proxy_devices[5]))) == float(
        (x * 2.0).sum())
  for c in clients:
    c.read("done")
    steps = [m for m in c.lines if "step" in m]
    assert len(steps) == 30 and all(m["ok"] for m in steps), steps


def test_a_slice_that_cannot_fit_is_refused_clearly(start_client, pathways,
                                                    proxy_devices):
  too_big = start_client(devices=16)
  msg = too_big.read("error")["error"]
  assert "a slice of 16 devices does not fit" in msg
  assert "the cluster has 8 devices in 2 islands" in msg
  off_island = start_client(devices=6, island=0)
  msg = off_island.read("error")["error"]
  assert "island 0 has 4 devices" in msg and "span islands" in msg
  no_island = start_client(devices=1, island=7)
  assert "island 7 does not exist" in no_island.read("error")["error"]
  # The controller goes on serving.
  y = jax.device_put(np.ones(4, np.float32), proxy_devices[0]) + 1
  np.testing.assert_array_equal(np.asarray(y), np.full(4, 2.0))


def test_a_killed_client_frees_what_it_held(start_client, pathways,
                                            proxy_devices):
  before = _status(pathways)
  victim = start_client(devices=4, hold_mb=4, forever=True, seed=4)
  survivor = start_client(devices=4, steps=40, seed=5)
  victim.read("holding")
  victim.read("step")
  held = [c for c in _status(pathways)["clients"]
          if sum(c["array_bytes"].values()) >= 4 * (4 << 20)]
  assert len(held) == 1, "the victim's memory does not show in status"
  victim.kill()  # mid-step: SIGKILL

  survivor.read("done")
  assert all(m["ok"] for m in survivor.lines if "step" in m)
  deadline = time.monotonic() + 20
  while time.monotonic() < deadline:
    now = _status(pathways)
    if (held[0]["client"] not in [c["client"] for c in now["clients"]] and
        now["live_buffers"] <= before["live_buffers"]):
      break
    time.sleep(0.2)
  else:
    raise AssertionError(f"the killed client's session or buffers remain: "
                         f"{now['clients']}, live buffers "
                         f"{now['live_buffers']} > {before['live_buffers']}")
