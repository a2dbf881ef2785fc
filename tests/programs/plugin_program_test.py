"""PluginProgram requests as pathwaysutils sends them, and hostile ones."""
from __future__ import annotations

import json
import types

import pytest

from jax_pathways.programs import plugin_program
from jax_pathways.status import Code, StatusError

OPTIONS = types.SimpleNamespace(type_name=plugin_program.PLUGIN_COMPILE_OPTIONS)


def _parse(body) -> plugin_program.ProfileRequest:
  text = body if isinstance(body, str) else json.dumps(body)
  program = types.SimpleNamespace(
      data=b"__serialized_plugin_program " + text.encode())
  return plugin_program.parse(program, OPTIONS)


def _refused(body, code: Code, match: str) -> None:
  with pytest.raises(StatusError, match=match) as e:
    _parse(body)
  assert e.value.status.code == code


def test_pathwaysutils_requests_are_read():
  # pathwaysutils 0.1.13 on jax 0.10.2 always sends xprof options.
  got = _parse({"profileRequest": {
      "traceLocation": "/logs/a", "maxNumHosts": 1,
      "includeResourceManagers": True,
      "xprofTraceOptions": {"traceDirectory": "/logs/a/",
                            "pwTraceOptions": {"enablePythonTracer": True},
                            "traceSessionName": "2026_11_23_20_39_35"},
      "maxDurationSecs": 2.0}})
  assert got == plugin_program.ProfileRequest("/logs/a", "2026_11_23_20_39_35",
                                              True)
  # Older JAX: no xprof options, so no result and no session name.
  assert _parse({"profileRequest": {"traceLocation": "/logs/b"}}) == \
      plugin_program.ProfileRequest("/logs/b", None, False)


@pytest.mark.parametrize("body, code, match", [
    ({"bulkWriteRequest": {}}, Code.UNIMPLEMENTED, "bulkWriteRequest"),
    ({"profileRequest": {}, "persistenceReadRequest": {}},
     Code.UNIMPLEMENTED, "is not served"),
    ([1, 2], Code.UNIMPLEMENTED, "of JSON type list is not served"),
    ("\xff{", Code.UNIMPLEMENTED, "is not JSON"),
    ({"profileRequest": {"traceLocation": "/a", "dump": 1}},
     Code.UNIMPLEMENTED, r"fields \['dump'\]"),
    ({"profileRequest": "x"}, Code.INVALID_ARGUMENT, "must be a JSON object"),
    ({"profileRequest": {"traceLocation": 7}}, Code.INVALID_ARGUMENT,
     "must be a path, got 7"),
    ({"profileRequest": {"traceLocation": "/a\u0000b"}},
     Code.INVALID_ARGUMENT, "must be a path"),
    ({"profileRequest": {"traceLocation": "relative/dir"}},
     Code.UNIMPLEMENTED, "absolute paths"),
    ({"profileRequest": {"traceLocation": "/a", "xprofTraceOptions": {
        "traceDirectory": "/a", "traceSessionName": ".."}}},
     Code.INVALID_ARGUMENT, "traceSessionName"),
    ({"profileRequest": {"traceLocation": "/a", "xprofTraceOptions": {
        "traceDirectory": "/a", "traceSessionName": "a/b"}}},
     Code.INVALID_ARGUMENT, "traceSessionName"),
    ({"profileRequest": {"traceLocation": "/a", "xprofTraceOptions": []}},
     Code.INVALID_ARGUMENT, "xprofTraceOptions must be an object"),
    ("[" * 100000, Code.UNIMPLEMENTED, "is not JSON"),  # too deep
    (" " * (65 << 20), Code.INVALID_ARGUMENT, "at most"),
])
def test_anything_else_is_refused_by_name(body, code, match):
  _refused(body, code, match)


def test_other_compile_options_are_refused():
  program = types.SimpleNamespace(data=b'{"profileRequest": {}}')
  with pytest.raises(StatusError, match="takes xla::ifrt::PluginCompileOptions"):
    plugin_program.parse(program, types.SimpleNamespace(type_name="x"))
