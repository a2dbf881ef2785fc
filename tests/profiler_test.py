"""jax.profiler through pathwaysutils (issue 19, item 3): its profiling
PluginProgram is served with the islands' launches written beside JAX's own
trace; any other PluginProgram is refused as UNIMPLEMENTED."""
import glob
import json
import os
import subprocess
import sys
import time

import jax
import pytest
from jax.extend import ifrt_programs

from jax_pathways import config

pytestmark = pytest.mark.integration

CLIENT = os.path.join(os.path.dirname(__file__), "profiler_client.py")


def _events(path: str) -> list[tuple[str, str, int, int]]:
  """(plane, line, event, start_ns, duration_ns) per event of an xplane.pb."""
  data = jax.profiler.ProfileData.from_file(path)
  return [(plane.name, line.name, event.name, event.start_ns,
           event.duration_ns)
          for plane in data.planes for line in plane.lines
          for event in line.events]


def test_jax_profiler_trace_holds_each_islands_launches(pathways, tmp_path):
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)
  env[config.ADDRESS] = pathways.address
  env[config.TOKEN] = pathways.token
  before = time.time_ns()
  done = subprocess.run([sys.executable, CLIENT, str(tmp_path)], env=env,
                        cwd=tmp_path, capture_output=True, text=True,
                        timeout=240, check=False)
  after = time.time_ns()
  lines = [json.loads(l) for l in done.stdout.splitlines() if l[:1] == "{"]
  assert lines and "devices" in lines[-1], done.stderr[-3000:]
  assert lines[-1]["devices"] == [0, 1]

  runs = glob.glob(str(tmp_path / "plugins" / "profile" / "*"))
  assert len(runs) == 1, runs  # the islands' files beside JAX's own
  files = sorted(os.listdir(runs[0]))
  assert "island_0.xplane.pb" in files and "island_1.xplane.pb" in files
  assert any(f.endswith(".xplane.pb") and not f.startswith("island_")
             for f in files), files  # JAX's client-side trace
  for island in (0, 1):
    path = os.path.join(runs[0], f"island_{island}.xplane.pb")
    events = _events(path)
    launches = [e for e in events if e[1] == "launch"]
    assert {e[0] for e in events} == {f"/device:CUSTOM:{island}"}
    assert [e[2] for e in launches] == ["jit_scaled_square"] * 3
    # As in JAX's files: times from the profile's start, given as wall clock.
    env = dict(jax.profiler.ProfileData.from_file(path)
               .find_plane_with_name("Task Environment").stats)
    start, stop = env["profile_start_time"], env["profile_stop_time"]
    assert before <= start < stop <= after
    for *_, offset, duration in launches:
      assert 0 <= offset <= offset + duration <= stop - start
    offsets = [e[3] for e in launches]
    assert offsets == sorted(offsets)


def _compile_plugin_program(text: str):
  client = jax.devices("proxy")[0].client
  return client.compile_ifrt_program(
      ifrt_programs.ifrt_programs.make_plugin_program(text),
      ifrt_programs.ifrt_programs.make_plugin_compile_options())


@pytest.mark.parametrize("text, error", [
    ('{"bulkReadRequest": {"arrays": []}}',
     r"UNIMPLEMENTED: PluginProgram \['bulkReadRequest'\] is not served"),
    ("not json", "UNIMPLEMENTED: PluginProgram b'not json' is not JSON"),
    ('{"profileRequest": {"traceLocation": "gs://bucket/run"}}',
     "UNIMPLEMENTED: trace directory 'gs://bucket/run': the controller "
     "writes"),
    ('{"profileRequest": {"traceLocation": "/tmp/x", "xprofTraceOptions": '
     '{"traceDirectory": "/tmp/x", "traceSessionName": "../../etc"}}}',
     "INVALID_ARGUMENT: traceSessionName must match"),
])
def test_other_plugin_programs_are_refused(proxy_devices, text, error):
  with pytest.raises(jax.errors.JaxRuntimeError, match=error):
    _compile_plugin_program(text)
