"""Worker: runs the controller's ops on this island, strictly in gang order.

The C++ Executor hands out ops by sequence number; this loop issues each one
to the PJRT backend without waiting for device data (launches, puts and
copies return futures) and files it with the completion thread, which
reports it once its arrays are ready. Arrays live here, keyed by the buffer
ids the controller chose; a failed op leaves its Status under its result ids,
so later ops fail with the original cause.

Payload headers per op kind (built by the controller's handlers):
  COMPILE  {"devices"}, blobs [program, compile options]
  LAUNCH   -                     (program = compiled program id)
  PUT      {"dtype", "shape", "sharding", "strides"?} blobs [bytes]
           or {..., "shards": [{"devices", "dtype", "shape", "strides"?}]}
           with one blob per shard
  FETCH    {"strides"?}
  COPY     {"mode": "reshard" | "shards" | "assemble", ...}
  SEND     {"island", "address", "arrays": [{"transfer", "shape", "sharding"}]}
  RECEIVE  {"island", "arrays": [{"transfer", "dtype", "shape", "source",
           "sharding"}]}: each distinct piece k of an array travels as
           transfer + k (see worker/shards.py)
"""
from __future__ import annotations

import json
from typing import Any, Callable

from absl import logging
import jax
import numpy as np

from jax_pathways import _core
from jax_pathways.dispatch import payloads
from jax_pathways.status import Code, Status, StatusError
from jax_pathways.worker.completions import Completions, error_status
from jax_pathways.worker.peers import Peers
from jax_pathways.worker import shards
from jax_pathways.worker.pjrt_backend import PjrtBackend, Program, np_dtype

OpKind = _core.OpKind
# How long a RECEIVE waits for its peer's bytes before failing the op.
RECEIVE_TIMEOUT_S = 300.0


class Worker:
  """The op loop of one island worker."""

  def __init__(self, executor: Any, backend: PjrtBackend, peers: Peers):
    self._executor = executor
    self._backend = backend
    self._peers = peers
    self._programs: dict[int, Program] = {}
    self._buffers: dict[int, jax.Array | Status] = {}
    self._completions = Completions(self._report)
    self._handlers: dict[Any, Callable[[Any], None]] = {
        OpKind.COMPILE: self._compile,
        OpKind.LAUNCH: self._launch,
        OpKind.PUT: self._put,
        OpKind.FETCH: self._fetch,
        OpKind.DELETE: self._delete,
        OpKind.COPY: self._copy,
        OpKind.SEND: self._send,
        OpKind.RECEIVE: self._receive,
    }

  def run(self) -> None:
    """Runs ops until the controller says stop or goes away."""
    try:
      while True:
        op = self._executor.next(1.0)
        if op is None:
          continue
        if op.kind == OpKind.SHUTDOWN:
          self._completions.add(op.seq, [])
          return
        try:
          self._handlers[op.kind](op)
        except Exception as e:  # pylint: disable=broad-except
          status = error_status(e)
          for b in op.results:
            self._buffers[b] = status
          if op.kind != OpKind.DELETE:  # deletions are never answered
            self._completions.fail(op.seq, status)
    except _core.JaxPathwaysError as e:
      logging.warning("controller is gone (%s); worker exits", e)
    finally:
      self._completions.close()

  def _report(self, seq: int, status: Status, payload: bytes) -> None:
    self._executor.complete(seq, int(status.code), status.message, payload)

  # ------------------------------------------------------------------ helpers
  def _array(self, buffer: int) -> jax.Array:
    value = self._buffers.get(buffer)
    if value is None:
      raise StatusError(Code.NOT_FOUND,
                        f"array (buffer {buffer}) is not on this worker: it "
                        "was deleted or never created")
    if isinstance(value, Status):
      raise StatusError(value.code, value.message)
    return value

  def _store(self, op: Any, arrays: list[jax.Array]) -> None:
    if len(arrays) != len(op.results):
      raise StatusError(Code.INTERNAL,
                        f"op produced {len(arrays)} arrays for "
                        f"{len(op.results)} result ids")
    for b, a in zip(op.results, arrays):
      self._buffers[b] = a

  # ------------------------------------------------------------------ op kinds
  def _compile(self, op: Any) -> None:
    header, (program, options) = payloads.decode(op.payload)
    prog = self._backend.compile(bytes(program), bytes(options),
                                 header["devices"])
    self._programs[op.program] = prog
    metadata = json.dumps(prog.metadata).encode()
    self._completions.add(op.seq, [], lambda: metadata)

  def _launch(self, op: Any) -> None:
    program = self._programs.get(op.program)
    if program is None:
      raise StatusError(Code.FAILED_PRECONDITION,
                        f"program {op.program} was not compiled on this worker")
    args = [self._array(b) for b in op.args]
    outputs = self._backend.execute(program, args)
    self._store(op, outputs)
    self._completions.add(op.seq, outputs)

  def _put(self, op: Any) -> None:
    header, blobs = payloads.decode(op.payload)
    sharding = self._backend.sharding(header["sharding"])
    if "shards" not in header:
      array = self._backend.put(blobs[0], header["dtype"], header["shape"],
                                sharding, header.get("strides"))
    else:
      devices = sharding._device_assignment  # pylint: disable=protected-access
      per_device: dict[Any, jax.Array] = {}
      for spec, blob in zip(header["shards"], blobs):
        for index in spec["devices"]:
          device = devices[index]
          per_device[device] = self._backend.put(
              blob, spec["dtype"], spec["shape"],
              jax.sharding.SingleDeviceSharding(device), spec.get("strides"))
      missing = [d for d in devices if d not in per_device]
      if missing:
        raise StatusError(Code.INVALID_ARGUMENT,
                          f"no shard given for devices {missing}")
      array = jax.make_array_from_single_device_arrays(
          tuple(header["shape"]), sharding, [per_device[d] for d in devices])
    self._store(op, [array])
    self._completions.add(op.seq, [array])

  def _fetch(self, op: Any) -> None:
    header, _ = payloads.decode(op.payload)
    array = self._array(op.args[0])
    strides = header.get("strides")
    self._completions.add(op.seq, [array],
                          lambda: self._backend.to_host(array, strides))

  def _delete(self, op: Any) -> None:
    # Only drop the reference: arrays made by copies, shards and assembly can
    # share device buffers, which PJRT frees once nothing uses them.
    # No event: a DELETE is done once ordered (see transport/messages.h).
    for b in op.args:
      self._buffers.pop(b, None)

  def _copy(self, op: Any) -> None:
    header, _ = payloads.decode(op.payload)
    mode = header["mode"]
    if mode == "reshard":
      sharding = self._backend.sharding(header["sharding"])
      outputs = [jax.device_put(self._array(b), sharding) for b in op.args]
    elif mode == "shards":
      outputs = self._backend.shards(self._array(op.args[0]))
      outputs = outputs[:len(op.results)]
    elif mode == "assemble":
      sharding = self._backend.sharding(header["sharding"])
      outputs = [self._backend.assemble(
          header["shape"], sharding, [self._array(b) for b in op.args])]
    else:
      raise StatusError(Code.INVALID_ARGUMENT, f"unknown copy mode {mode!r}")
    self._store(op, outputs)
    self._completions.add(op.seq, outputs)

  def _send(self, op: Any) -> None:
    header, _ = payloads.decode(op.payload)
    link = self._peers.outgoing(header["island"], header["address"],
                                timeout=30.0)
    sources: list[jax.Array | Status] = []
    for b in op.args:
      try:
        sources.append(self._array(b))
      except StatusError as e:
        sources.append(e.status)

    def push() -> bytes:
      # Every piece is pushed, bytes or error, so the receiver never waits
      # for one that will not come.
      failure = None
      for source, meta in zip(sources, header["arrays"]):
        positions = shards.distinct(shards.indices(meta["sharding"],
                                                   meta["shape"]))
        for k, pos in enumerate(positions):
          transfer = meta["transfer"] + k
          try:
            if isinstance(source, Status):
              raise StatusError(source.code, source.message)
            piece = np.asarray(self._backend.shards(source)[pos])
            self._peers.links.send(
                link, transfer, 0, "",
                np.ascontiguousarray(piece).reshape(-1).view(np.uint8))
          except Exception as e:  # pylint: disable=broad-except
            status = error_status(e)
            failure = failure or StatusError(status.code, status.message)
            self._peers.links.send(link, transfer, int(status.code),
                                   status.message, b"")
      if failure is not None:
        raise failure
      return b""

    self._completions.add(op.seq, [], push)

  def _receive(self, op: Any) -> None:
    header, _ = payloads.decode(op.payload)
    link = self._peers.incoming(header["island"], timeout=RECEIVE_TIMEOUT_S)
    outputs = []
    for meta in header["arrays"]:
      shape, dtype = meta["shape"], np_dtype(meta["dtype"])
      src = shards.indices(meta["source"], shape)
      pieces = {}
      for k, pos in enumerate(shards.distinct(src)):
        data = self._peers.links.receive(link, meta["transfer"] + k,
                                         RECEIVE_TIMEOUT_S)
        size = [b - a for a, b in src[pos]]
        pieces[src[pos]] = np.frombuffer(data, dtype).reshape(size)
      sharding = self._backend.sharding(meta["sharding"])
      dst = shards.indices(meta["sharding"], shape)
      if all(d in pieces for d in dst):  # same layout: no host assembly
        devices = sharding._device_assignment  # pylint: disable=protected-access
        parts = [jax.device_put(pieces[d], dev) for d, dev in zip(dst, devices)]
        outputs.append(jax.make_array_from_single_device_arrays(
            tuple(shape), sharding, parts))
      else:
        outputs.append(jax.device_put(
            shards.assemble_on_host(shape, dtype, pieces), sharding))
    self._store(op, outputs)
    self._completions.add(op.seq, outputs)
