"""Admin client: a controller's status, op traces of its islands, and
whether a virtual slice would fit."""
from __future__ import annotations

import json
from typing import Any

import grpc

from jax_pathways.cluster import addresses
from jax_pathways.wire.session_keys import (ADMIN_CANCEL, ADMIN_CHECK_SLICE,
                                             ADMIN_STATUS,
                                             ADMIN_SUPERVISION, ADMIN_TRACE,
                                             TOKEN_HEADER)


class AdminError(RuntimeError):
  """The controller could not be asked (down, wrong token, ...)."""

  def __init__(self, message: str, code: grpc.StatusCode, details: str = ""):
    super().__init__(message)
    self.code = code
    self.details = details  # the controller's own words


def _call(address: str, method: str, body: bytes, token: str | None,
          timeout: float) -> dict[str, Any]:
  metadata = [(TOKEN_HEADER, token)] if token else []
  try:
    with grpc.insecure_channel(addresses.dial_target(address)) as channel:
      call = channel.unary_unary(method, request_serializer=None,
                                 response_deserializer=None)
      raw = call(body, timeout=timeout, metadata=metadata)
  except grpc.RpcError as e:
    raise AdminError(f"controller at {address}: {e.code().name}: "
                     f"{e.details()}", e.code(), e.details() or "") from None
  return json.loads(raw)


def status(address: str, token: str | None = None,
           timeout: float = 5.0) -> dict[str, Any]:
  """The controller's status, as `jax-pathways status` prints it."""
  return _call(address, ADMIN_STATUS, b"", token, timeout)


def trace(address: str, action: str, token: str | None = None,
          timeout: float = 60.0) -> dict[str, Any]:
  """Starts ("start") or stops ("stop") op tracing on every island.

  Stop answers once every op submitted before it has finished, with
  {"islands": {"<id>": [record, ...]}}, each record as the island's worker
  keeps it (worker/tracer.py, Tracer.stop).
  """
  return _call(address, ADMIN_TRACE, json.dumps({"action": action}).encode(),
               token, timeout)


def cancel(address: str, client: int, token: str | None = None,
           timeout: float = 10.0) -> None:
  """Ends client `client` (a number `status` lists): its session ends
  CANCELLED, what it held is freed, and islands running its programs are
  taken back (their workers dropped and started again: every array on them
  is lost). AdminError NOT_FOUND if no such client is connected."""
  _call(address, ADMIN_CANCEL, json.dumps({"client": client}).encode(),
        token, timeout)


def check_slice(address: str, devices: str | None, island: str | None,
                token: str | None = None, timeout: float = 5.0) -> None:
  """Raises AdminError (INVALID_ARGUMENT, RESOURCE_EXHAUSTED) with the
  reason if a client asking for this slice could not be placed."""
  _call(address, ADMIN_CHECK_SLICE,
        json.dumps({"devices": devices, "island": island}).encode(), token,
        timeout)


def report_supervision(address: str, report: dict[str, Any],
                       token: str | None = None,
                       timeout: float = 5.0) -> None:
  """Tells the controller what a supervisor (the embedded cluster's) did to
  island `report["island"]`'s worker: {"island", "pid": its current
  worker's, "restarts": processes started after the first, "given_up":
  why it stopped restarting it, or ""}. `status` shows it; a give-up is
  added to the island's error, which every later call on it gets."""
  _call(address, ADMIN_SUPERVISION, json.dumps(report).encode(), token,
        timeout)
