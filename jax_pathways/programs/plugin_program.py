"""PluginProgram: the JSON requests pathwaysutils compiles, read as hostile input.

`pathwaysutils.initialize()` makes `jax.profiler.start_trace(log_dir)` compile
an `xla::ifrt::PluginProgram` whose data is

    {"profileRequest": {"traceLocation": str, "maxNumHosts": int,
                        "includeResourceManagers": bool,
                        "xprofTraceOptions": {"traceDirectory": str,
                                              "traceSessionName": str, ...},
                        "maxDurationSecs": float}}

(pathwaysutils/profiling.py, 0.1.13) and executes it once to start and once
to stop. Its persistence helper and orbax's CloudPathwaysArrayHandler
compile the four persistence requests (storage/requests.py). Any other
(resharding, say) is UNIMPLEMENTED, naming what it asked.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

from jax_pathways.status import brief, invalid_argument, unimplemented
from jax_pathways.storage import requests

PLUGIN_PROGRAM = "xla::ifrt::PluginProgram"
PLUGIN_COMPILE_OPTIONS = "xla::ifrt::PluginCompileOptions"
# plugin_program_serdes.cc puts it before the program's data.
_SERIALIZATION_PREFIX = b"__serialized_plugin_program "
# A bulk persistence request names every array of a model.
_MAX_BYTES = 64 << 20
_MAX_PATH = 4096
# Becomes a directory name: JAX names its run directory after the same
# session id, so both traces land side by side.
_SESSION_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
_SERVED = f"profileRequest and {', '.join(requests.KINDS)}"
_REQUEST_KEYS = {"traceLocation", "maxNumHosts", "includeResourceManagers",
                 "xprofTraceOptions", "maxDurationSecs"}
_XPROF_KEYS = {"traceDirectory", "traceSessionName", "hostTraceLevel",
               "pwTraceOptions"}


@dataclasses.dataclass(frozen=True)
class ProfileRequest:
  trace_dir: str  # the directory the user gave jax.profiler.start_trace
  session_name: str | None  # JAX's run directory under plugins/profile
  # pathwaysutils expects a result (and reads none) when it sent xprof
  # options.
  has_result: bool


def parse(program: Any, compile_options: Any
          ) -> ProfileRequest | requests.PersistenceRequest:
  """The request `program` (an xla.ifrt.Serialized) carries."""
  if compile_options.type_name != PLUGIN_COMPILE_OPTIONS:
    raise invalid_argument(
        f"a PluginProgram takes {PLUGIN_COMPILE_OPTIONS}, not "
        f"{compile_options.type_name!r}")
  data = program.data
  if data.startswith(_SERIALIZATION_PREFIX):
    data = data[len(_SERIALIZATION_PREFIX):]
  if len(data) > _MAX_BYTES:
    raise invalid_argument(f"PluginProgram of {len(data)} bytes; at most "
                           f"{_MAX_BYTES} are read")
  try:
    body = json.loads(data)
  except (ValueError, UnicodeDecodeError, RecursionError):
    raise unimplemented(
        f"PluginProgram {bytes(data[:80])!r} is not JSON; jax_pathways serves "
        f"pathwaysutils' {_SERVED}") from None
  kind = next(iter(body)) if isinstance(body, dict) and len(body) == 1 \
      else None
  if kind == "profileRequest":
    return _profile_request(body[kind])
  if kind in requests.KINDS:
    return requests.parse(kind, body[kind])
  asked = (brief(sorted(body)) if isinstance(body, dict)
           else f"of JSON type {type(body).__name__}")
  raise unimplemented(f"PluginProgram {asked} is not served: "
                      f"jax_pathways serves pathwaysutils' {_SERVED}")


def _profile_request(req: Any) -> ProfileRequest:
  if not isinstance(req, dict):
    raise invalid_argument("profileRequest must be a JSON object")
  unknown = set(req) - _REQUEST_KEYS
  if unknown:
    raise unimplemented(f"profileRequest fields {sorted(unknown)} are not "
                        f"served (known: {sorted(_REQUEST_KEYS)})")
  xprof = req.get("xprofTraceOptions", {})
  if not isinstance(xprof, dict) or set(xprof) - _XPROF_KEYS:
    raise invalid_argument(
        f"xprofTraceOptions must be an object with fields among "
        f"{sorted(_XPROF_KEYS)}, got {brief(xprof)}")
  trace_dir = xprof.get("traceDirectory", req.get("traceLocation"))
  if not isinstance(trace_dir, str) or not trace_dir \
      or len(trace_dir) > _MAX_PATH or "\0" in trace_dir:
    raise invalid_argument(f"the trace directory must be a path, got "
                           f"{brief(trace_dir)}")
  if "://" in trace_dir or not os.path.isabs(trace_dir):
    raise unimplemented(
        f"trace directory {trace_dir!r}: the controller writes the islands' "
        "traces to absolute paths on its own filesystem only (see "
        "docs/architecture.md, Seeing it run)")
  name = xprof.get("traceSessionName")
  if name is not None and (not isinstance(name, str) or name in (".", "..")
                           or not _SESSION_NAME.fullmatch(name)):
    raise invalid_argument(f"traceSessionName must match "
                           f"{_SESSION_NAME.pattern}, got {brief(name)}")
  return ProfileRequest(os.path.normpath(trace_dir), name,
                        "xprofTraceOptions" in req)
