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
  head, tails = payloads.parts({"dtype": "float32"}, data)
  assert len(tails) == 1  # the blob itself, its padding in the head
  assert tails[0] is data
  assert head + data.tobytes() == payloads.encode({"dtype": "float32"}, data)
  blobs = [data, np.arange(3, dtype=np.uint8), b"x" * 64]
  head, tails = payloads.parts({"shards": 3}, *blobs)
  assert [t for t in tails if any(t is b for b in blobs)] == blobs
  joined = head + b"".join(bytes(memoryview(t).cast("B")) for t in tails)
  assert joined == payloads.encode({"shards": 3}, *blobs)


def test_empty_and_corrupt():
  assert payloads.decode(b"") == ({}, [])
  with pytest.raises(ValueError):
    payloads.decode(b"\xff\xff\x00\x00{}")
  with pytest.raises(ValueError):
    payloads.decode(payloads.encode({}, b"abc")[:-1])


def test_blobs_start_at_multiples_of_64():
  blobs = [b"p", np.arange(7, dtype=np.uint8), b"", b"x" * 100]
  for key in ("k", "a much longer key"):
    raw = np.frombuffer(payloads.encode({key: 1}, *blobs), np.uint8)
    header, views = payloads.decode(raw)
    assert header == {key: 1}
    base = raw.ctypes.data
    for view, blob in zip(views, blobs):
      assert (np.frombuffer(view, np.uint8).ctypes.data - base) % 64 == 0
      assert bytes(view) == bytes(memoryview(blob).cast("B"))


def test_a_template_encodes_what_encode_does_with_its_field_filled():
  header = {"source": {"devices": [[0, 1]], "op_sharding": None},
            "shape": [32, 32], "dtype": "float32", "pull_from": "ünïcode:1"}
  template = payloads.template(header, "transfer", 18)
  for transfer in (2**58, 2**59 - 2**20):
    raw = template.fill(transfer)
    assert payloads.decode(raw) == ({**header, "transfer": transfer}, [])
    assert len(raw) == len(payloads.encode({**header, "transfer": transfer}))
  with pytest.raises(ValueError, match="does not have 18 digits"):
    template.fill(2**60)
