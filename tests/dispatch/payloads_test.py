"""Op payloads: JSON header plus raw blobs."""
import json

import numpy as np
import pytest

from jax_pathways.wire import payloads


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


def test_a_header_seen_before_is_not_parsed_again():
  """decode(headers=) keeps each header parsed once; the blobs are still
  this payload's own, checked against its length."""
  headers: dict = {}
  one = payloads.encode({"shape": [2]}, b"ab", b"c" * 70)
  two = payloads.encode({"shape": [2]}, b"xy", b"z" * 70)
  h1, blobs1 = payloads.decode(one, headers)
  h2, blobs2 = payloads.decode(two, headers)
  assert h1 is h2 and h1 == {"shape": [2]} and len(headers) == 1
  assert [bytes(b) for b in blobs1] == [b"ab", b"c" * 70]
  assert [bytes(b) for b in blobs2] == [b"xy", b"z" * 70]
  with pytest.raises(ValueError, match="runs past"):
    payloads.decode(two[:-1], headers)
  for _ in range(payloads.HEADERS_KEPT + 1):  # bounded
    payloads.decode(payloads.encode({"n": len(headers)}), headers)
  assert len(headers) <= payloads.HEADERS_KEPT


@pytest.mark.parametrize("sizes", [[-4], [1.5], "ab", [True]])
def test_blob_sizes_that_are_not_sizes_are_refused(sizes):
  """A header's blob sizes are non-negative ints (a negative one would make
  the next blob overlap this one)."""
  text = json.dumps({"_blobs": sizes}).encode()
  raw = len(text).to_bytes(4, "little") + text + b"\0" * 64
  with pytest.raises(ValueError, match="not sizes"):
    payloads.decode(raw)
