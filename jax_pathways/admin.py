"""Admin client: reads a controller's status (islands, clients, queues)."""
from __future__ import annotations

import json
from typing import Any

import grpc

_METHOD = "/jax_pathways.Admin/Status"
_TOKEN_HEADER = "jax-pathways-token"


class AdminError(RuntimeError):
  """The controller could not be asked (down, wrong token, ...)."""

  def __init__(self, message: str, code: grpc.StatusCode):
    super().__init__(message)
    self.code = code


def _target(address: str) -> str:
  return address.split("://", 1)[1] if "://" in address else address


def status(address: str, token: str | None = None,
           timeout: float = 5.0) -> dict[str, Any]:
  """The controller's status, as `jax-pathways status` prints it."""
  metadata = [(_TOKEN_HEADER, token)] if token else []
  try:
    with grpc.insecure_channel(_target(address)) as channel:
      call = channel.unary_unary(_METHOD, request_serializer=None,
                                 response_deserializer=None)
      raw = call(b"", timeout=timeout, metadata=metadata)
  except grpc.RpcError as e:
    raise AdminError(f"controller at {address}: {e.code().name}: "
                     f"{e.details()}", e.code()) from None
  return json.loads(raw)
