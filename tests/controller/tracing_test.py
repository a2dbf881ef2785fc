"""Recording: one client's profile owns the islands' tracers at a time."""
import pytest

from jax_pathways.controller.op_timing import Recording
from jax_pathways.status import Code, StatusError


def test_a_second_client_is_refused_at_once_not_queued():
  recording = Recording()
  recording.claim(1)
  recording.claim(1)  # its own again: fine
  with pytest.raises(StatusError, match="client 1 is profiling") as e:
    recording.claim(2)
  assert e.value.status.code == Code.FAILED_PRECONDITION
  recording.release(2)  # not its claim: client 1 keeps it
  with pytest.raises(StatusError, match="client 1 is profiling"):
    recording.claim(2)
  recording.release(1)
  recording.claim(2)
