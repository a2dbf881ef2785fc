"""Op payloads: JSON header plus raw blobs."""
import numpy as np
import pytest

from jax_pathways.dispatch import payloads


def test_round_trip_with_blobs():
  data = np.arange(10, dtype=np.float32)
  raw = payloads.encode({"dtype": "float32"}, b"prog", data.view(np.uint8))
  header, (a, b) = payloads.decode(np.frombuffer(raw, np.uint8))
  assert header == {"dtype": "float32"}
  assert bytes(a) == b"prog"
  assert np.array_equal(np.frombuffer(b, np.float32), data)


def test_parts_are_the_encoding_unjoined():
  data = np.arange(10, dtype=np.float32).view(np.uint8)
  head, tail = payloads.parts({"dtype": "float32"}, data)
  assert tail is data
  assert head + tail.tobytes() == payloads.encode({"dtype": "float32"}, data)


def test_empty_and_corrupt():
  assert payloads.decode(b"") == ({}, [])
  with pytest.raises(ValueError):
    payloads.decode(b"\xff\xff\x00\x00{}")
  with pytest.raises(ValueError):
    payloads.decode(payloads.encode({}, b"abc")[:-1])
