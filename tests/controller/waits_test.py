"""A request that waits for an upload holds only its own session: other
clients are served meanwhile, it runs once the upload arrives, the requests
behind it keep their order, and it is answered when its session ends.

At 385bf6b one MakeArrayFromHostBuffer naming a host buffer that never
arrived blocked the controller's only request thread for 600 s."""
import time

import numpy as np
import pytest

pytestmark = pytest.mark.integration

OK, CANCELLED = 0, 1


def _round_trip(session, values: np.ndarray, handle: int) -> np.ndarray:
  """Uploads, makes an array, fetches it back."""
  session.store(handle, values.tobytes())
  r = session.wait(session.send_make_array(handle, handle, values.size))
  assert r.response_metadata.status.code == OK, r
  return np.frombuffer(session.fetch(handle, handle + 1), np.float32)


def test_a_missing_upload_holds_only_its_own_session(raw_session):
  stuck, other = raw_session(), raw_session()
  waiting = stuck.send_make_array(500, 500, 4)
  behind = stuck.send(get_default_layout_request=lambda b: b.dims.extend([4]))

  # Another client is served at once, several times over.
  start = time.monotonic()
  for k in range(5):
    values = np.arange(8, dtype=np.float32) + k
    np.testing.assert_array_equal(_round_trip(other, values, 100 + 10 * k),
                                  values)
  assert time.monotonic() - start < 10

  # The upload arrives: the waiting request runs, then the one behind it.
  values = np.array([1.5, -2, 3, 4], np.float32)
  stuck.store(500, values.tobytes())
  assert stuck.wait(waiting).response_metadata.status.code == OK
  layout = stuck.wait(behind)
  assert layout.get_default_layout_response.serialized_pjrt_layout == b"{0}"
  np.testing.assert_array_equal(
      np.frombuffer(stuck.fetch(500, 501), np.float32), values)


def test_a_waiting_request_is_cancelled_when_its_session_ends(raw_session):
  session = raw_session()
  session.store(600, np.zeros(4, np.float32).tobytes())
  # The same host buffer named twice: the second request waits for an
  # upload that will never come.
  first = session.send_make_array(600, 600, 4)
  assert session.wait(first).response_metadata.status.code == OK
  second = session.send_make_array(600, 601, 4)
  # Behind the waiting request: one the fast path could take, held in C++
  # until Python is done; the close must not wait for them.
  behind = session.send(destruct_array_request=lambda b: b.array_handle
                        .append(600))
  session.half_close()
  start = time.monotonic()
  status = session.wait(second).response_metadata.status
  assert time.monotonic() - start < 10
  assert status.code == CANCELLED
  assert status.message == (
      "the client's session ended while a request waited (the upload of host "
      "buffer 600 did not arrive within 600 s)")
  assert session.wait(behind).response_metadata.status.code == OK
