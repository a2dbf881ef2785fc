"""A worker's wait for the islands' global client being built: it ends
with the build, or at once when an island of it is lost (no processes: the
build is a future that never finishes, as when a member never joins)."""
import concurrent.futures
import threading
import time

import pytest

from jax_pathways.status import StatusError
from jax_pathways.worker.pjrt_backend import Join, PjrtBackend


def _building(members, losses):
  """A backend building a generation of `members` that never finishes;
  `losses` holds the loss notices that have arrived, as
  Executor.pending_losses gives them: (island, upto, why)."""
  backend = PjrtBackend.__new__(PjrtBackend)  # no devices needed
  backend._join_lock = threading.Lock()
  backend._joining = Join(0, concurrent.futures.Future(), tuple(members),
                          lambda: list(losses))
  return backend


def test_a_wait_for_the_build_ends_when_a_member_is_lost():
  losses = []
  backend = _building((0, 1), losses)
  threading.Timer(0.3, losses.append, ((1, 7, "w1 is lost"),)).start()
  started = time.monotonic()
  with pytest.raises(StatusError, match=r"could not build the islands' "
                     r"global client \(generation 0\): island 1 was lost "
                     "while it was built"):
    backend.current_global()
  assert time.monotonic() - started < 30  # not JOIN_WAIT_S (150 s)
  # Handled (the notice is gone): the build is dropped, so the next op
  # that needs it fails at once too.
  losses.clear()
  backend.abandon_join(1, "w1 is lost")
  with pytest.raises(StatusError, match=r"island 1 was lost while it was "
                     r"built \(w1 is lost\)"):
    backend.current_global()


def test_the_loss_of_an_island_outside_the_build_is_not_waited_on():
  backend = _building((0, 1), [(2, 7, "w2 is lost")])
  backend.abandon_join(2, "w2 is lost")
  future = backend._joining.future
  threading.Timer(0.3, future.set_exception,
                  (RuntimeError("it did not join"),)).start()
  with pytest.raises(StatusError, match="it did not join"):
    backend.current_global()  # waited for the build, which failed
