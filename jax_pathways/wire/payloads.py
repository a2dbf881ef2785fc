"""Payloads: the bytes inside an op or event, between controller and workers.

The C++ core moves payloads without reading them. Each is a small JSON header
followed by zero or more raw blobs (programs, array bytes), so array data is
never base64-encoded or pickled:

    u32 header_length | header JSON | pad | blob 0 | pad | blob 1 | ...

The header lists the blob lengths under "_blobs". Each blob starts at a
multiple of 64 bytes from the payload's start (zero padding before it): the
C++ channel receives payloads at 64-byte aligned addresses, so an uploaded
array's bytes are aligned on the worker and PJRT CPU puts them without a
copy (a 16 MB copy when they are not). What each op kind's header
holds is documented where it is built (controller handlers) and read
(worker/worker.py).
"""
from __future__ import annotations

import json
import struct
from typing import Any, NamedTuple

_U32 = struct.Struct("<I")
ALIGN = 64  # where each blob starts
HEADERS_KEPT = 1024  # decode(headers=): distinct headers kept


class Pieces(NamedTuple):
  """A blob held by the C++ side in the pieces it arrived in (an upload as
  gRPC received it): one object however many pieces, sent as consecutive
  tails, so the worker gets one blob."""
  capsule: Any  # from _server.HostBuffers.take
  nbytes: int


def encode(header: dict[str, Any], *blobs: bytes | memoryview) -> bytes:
  head, tails = parts(header, *blobs)
  return b"".join([head, *tails])


def parts(header: dict[str, Any], *blobs: Any) -> tuple[bytes, list[Any]]:
  """encode(header, *blobs) as (head, tails), unjoined: the dispatcher sends
  the tails after the head without copying those the C++ side made (uploads
  taken from HostBuffers), so array bytes are not copied twice more on
  their way through the controller. Tails are the blobs and the padding
  between them, in order."""
  head, pads = frame(header, [nbytes(b) for b in blobs])
  return head, tails(pads, blobs)


def tails(pads: list[bytes], blobs: Any) -> list[Any]:
  """The tails of a payload framed with `pads` (frame()) for `blobs`."""
  out = []
  for pad, blob in zip(pads, blobs):
    if pad:
      out.append(pad)
    out.append(blob.capsule if isinstance(blob, Pieces) else blob)
  return out


def frame(header: dict[str, Any], sizes: list[int]
          ) -> tuple[bytes, list[bytes]]:
  """parts() for blobs of `sizes`, without them: the head, and the padding
  that goes before each blob (b"" for the first: it is in the head)."""
  head = dict(header)
  head["_blobs"] = sizes
  text = json.dumps(head, separators=(",", ":")).encode()
  head = _U32.pack(len(text)) + text
  if sizes:  # the first blob's padding, in the head: one tail fewer
    head += bytes(_pad(len(head)))
  offset, pads = len(head), []
  for size in sizes:
    pads.append(bytes(_pad(offset)))
    offset += len(pads[-1]) + size
  return head, pads


def nbytes(blob: Any) -> int:
  """The length of a blob: a buffer, or Pieces."""
  if isinstance(blob, Pieces):
    return blob.nbytes
  return memoryview(blob).nbytes


def _pad(offset: int) -> int:
  return -offset % ALIGN


def decode(payload: Any, headers: dict[bytes, Any] | None = None
           ) -> tuple[dict[str, Any], list[memoryview]]:
  """Splits a payload (bytes or uint8 array) into its header and blob views.

  headers: a dict the caller keeps, of the headers parsed before (a
  worker's PUTs repeat the same few step after step, and parsing one costs
  more than the rest of a small PUT); a header found there is the same
  object every time, so callers read it and never change it."""
  view = memoryview(payload).cast("B")
  if len(view) == 0:
    return {}, []
  if len(view) < 4:
    raise ValueError("payload shorter than its header length")
  (n,) = _U32.unpack(view[:4])
  if 4 + n > len(view):
    raise ValueError("payload header runs past the payload")
  text = bytes(view[4:4 + n])
  parsed = None if headers is None else headers.get(text)
  if parsed is None:
    header = json.loads(text)
    sizes = header.pop("_blobs", [])
    if not isinstance(sizes, list) or not all(
        type(size) is int and size >= 0 for size in sizes):  # pylint: disable=unidiomatic-typecheck
      raise ValueError("payload blob sizes are not sizes")
    parsed = header, sizes
    if headers is not None:
      if len(headers) >= HEADERS_KEPT:
        headers.clear()
      headers[text] = parsed
  header, sizes = parsed
  blobs, pos = [], 4 + n
  for size in sizes:
    pos += _pad(pos)
    if pos + size > len(view):
      raise ValueError("payload blob runs past the payload")
    blobs.append(view[pos:pos + size])
    pos += size
  return header, blobs
