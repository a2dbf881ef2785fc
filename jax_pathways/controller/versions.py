"""Protocol versions: which IFRT-proxy versions this controller speaks.

jaxlib 0.10.2's client offers protocol versions 16-25 and IFRT SerDes
versions 0-3, and aborts the user's process if the reply is outside what it
offered: so the choice is always inside both ranges, or an error.
See docs/protocol_versions.md for what each version changed.
"""
from __future__ import annotations

from jax_pathways.status import invalid_argument

MIN_PROTOCOL_VERSION = 16  # kExecutableDevices: the client's minimum
MAX_PROTOCOL_VERSION = 25
MIN_SERDES_VERSION = 0
MAX_SERDES_VERSION = 3     # every serializer still writes version 0


def choose(client_min: int, client_max: int, ours_min: int, ours_max: int,
           what: str) -> int:
  version = min(client_max, ours_max)
  if version < client_min or version < ours_min:
    raise invalid_argument(
        f"jax_pathways and this client share no {what} version: client "
        f"offers [{client_min}, {client_max}], jax_pathways supports "
        f"[{ours_min}, {ours_max}]")
  return version


def negotiate(min_version, max_version) -> tuple[int, int]:
  """(protocol, serdes) for a GrpcGetVersionRequest's min/max versions."""
  protocol = choose(min_version.protocol_version, max_version.protocol_version,
                    MIN_PROTOCOL_VERSION, MAX_PROTOCOL_VERSION, "protocol")
  serdes = choose(min_version.ifrt_serdes_version_number,
                  max_version.ifrt_serdes_version_number,
                  MIN_SERDES_VERSION, MAX_SERDES_VERSION, "IFRT SerDes")
  return protocol, serdes
