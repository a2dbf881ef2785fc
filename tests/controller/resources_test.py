"""What a client holds comes back: deleted arrays leave the dispatcher's
books, and a client that goes leaves nothing in `status`.

At 385bf6b every DeleteArray left its buffer in the books for good
(live_buffers grew by one per deleted array, also after the client left)."""
import gc
import time

import jax
import numpy as np
import pytest

from jax_pathways import admin

pytestmark = pytest.mark.integration


def _settled(pathways, key: str, want: int, timeout: float = 20.0) -> dict:
  """Status once status[key] <= want (deletions travel asynchronously)."""
  deadline = time.monotonic() + timeout
  while True:
    status = admin.status(pathways.address, pathways.token)
    if status[key] <= want or time.monotonic() > deadline:
      return status
    time.sleep(0.05)


def _quiet(pathways, hold: float = 0.5, timeout: float = 20.0) -> dict:
  """Status once live_buffers has held still for `hold` seconds.

  JAX's proxy client batches DestructArray: arrays that earlier tests
  dropped may still be leaving the books when a test starts."""
  gc.collect()
  deadline = time.monotonic() + timeout
  status = admin.status(pathways.address, pathways.token)
  still_since = time.monotonic()
  while time.monotonic() < deadline:
    time.sleep(0.05)
    now = admin.status(pathways.address, pathways.token)
    if now["live_buffers"] != status["live_buffers"]:
      still_since = time.monotonic()
    elif time.monotonic() - still_since >= hold:
      return now
    status = now
  return status


def test_deleted_arrays_leave_the_books(pathways, proxy_devices):
  before = _quiet(pathways)["live_buffers"]
  f = jax.jit(lambda a: a * 2 + 1)
  for k in range(100):
    x = jax.device_put(np.full(16, k, np.float32), proxy_devices[k % 8])
    y = f(x)
    np.testing.assert_array_equal(np.asarray(y), np.full(16, 2 * k + 1))
    x.delete()  # DeleteArray, then DestructArray when x goes
    del x, y
  gc.collect()
  # A leak would be one buffer per deleted array: 100 more, which buffers
  # of earlier tests still leaving cannot hide.
  assert _settled(pathways, "live_buffers", before)["live_buffers"] <= before


def test_a_client_that_goes_leaves_nothing(raw_session, pathways):
  before = _quiet(pathways)
  session = raw_session()
  values = np.arange(4, dtype=np.float32)
  for h in range(1, 41):
    session.store(h, values.tobytes())
    assert session.wait(session.send_make_array(h, h, 4)
                        ).response_metadata.status.code == 0
  # Half deleted and destructed by the client, half left for its exit;
  # fetched buffers left in the host-buffer store too.
  r = session.call(delete_array_request=lambda b: b.array_handle.extend(
      range(1, 21)))
  assert r.response_metadata.status.code == 0
  r = session.call(destruct_array_request=lambda b: b.array_handle.extend(
      range(1, 21)))
  assert r.response_metadata.status.code == 0
  np.testing.assert_array_equal(
      np.frombuffer(session.fetch(21, 1000), np.float32), values)
  during = admin.status(pathways.address, pathways.token)
  assert during["live_buffers"] == before["live_buffers"] + 20
  assert during["host_buffer_bytes"] == before["host_buffer_bytes"] + 16
  assert len(during["clients"]) == len(before["clients"]) + 1

  session.close()
  after = _settled(pathways, "live_buffers", before["live_buffers"])
  for key in ("live_buffers", "host_buffer_bytes"):
    assert after[key] == before[key], key
  assert after["clients"] == before["clients"]
