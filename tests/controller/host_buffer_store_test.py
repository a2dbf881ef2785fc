"""Host buffers: per session, one-shot uploads, bounded waits."""
import threading

import pytest

from jax_pathways.controller.host_buffer_store import HostBufferStore
from jax_pathways.status import StatusError


def test_store_lookup_delete():
  s = HostBufferStore()
  s.open_session(1)
  s.store(1, 5, b"abc")
  assert s.lookup(1, 5) == b"abc" and s.total_bytes() == 3
  with pytest.raises(StatusError, match="already exists"):
    s.store(1, 5, b"x")
  s.delete(1, 5)
  with pytest.raises(StatusError, match="not found"):
    s.lookup(1, 5)
  with pytest.raises(StatusError, match="unknown session"):
    s.store(2, 1, b"")


def test_take_waits_for_the_upload():
  s = HostBufferStore()
  s.open_session(1)
  threading.Timer(0.05, lambda: s.store(1, 9, b"late")).start()
  assert s.take(1, 9, timeout=5) == b"late"
  assert s.total_bytes() == 0
  with pytest.raises(StatusError, match="did not arrive"):
    s.take(1, 10, timeout=0.05)


def test_closing_a_session_frees_it():
  s = HostBufferStore()
  s.open_session(1)
  s.store(1, 1, b"1234")
  s.close_session(1)
  assert s.total_bytes() == 0
