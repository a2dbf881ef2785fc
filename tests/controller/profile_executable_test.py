"""ProfileExecutable against a fake dispatcher: start, stop and the files,
one client at a time, a client that leaves while recording, failures."""
from __future__ import annotations

import json
import threading
import types
from typing import Any

import jax
import pytest

from jax_pathways.controller.op_timing import Recording
from jax_pathways.controller.profile_executable import ProfileExecutable
from jax_pathways.programs.plugin_program import ProfileRequest
from jax_pathways.status import Code, Status, StatusError
from jax_pathways.wire import payloads

ISLANDS = (0, 1)
# [seq, kind, name, issued, issue end, ready, waited], as workers record.
RECORDS = {"0": [[1, "launch", "jit_f", 1_000_100, 1_000_200, 1_000_900],
                 [2, "launch", "jit_f", 1_000_300, 1_000_400, 1_002_000]],
           "1": [[1, "receive", "receive", 1_000_050, 1_000_060, 1_000_500],
                 [2, "launch", "jit_g", 1_000_600, 1_000_700, 1_003_000]]}


class FakeDispatcher:
  """Takes the TRACE gangs; the test answers them."""

  def __init__(self):
    self.gangs: list[tuple[list[Any], Any]] = []

  def submit(self, gang, on_done=None) -> None:
    self.gangs.append((list(gang), on_done))

  def action(self, i: int) -> str:
    return payloads.decode(self.gangs[i][0][0].payload)[0]["action"]


def _services() -> Any:
  return types.SimpleNamespace(topology=None, dispatcher=FakeDispatcher(),
                               recording=Recording())


def _executable(tmp_path, owner: int = 1) -> ProfileExecutable:
  return ProfileExecutable(ProfileRequest(str(tmp_path), "run1", True),
                           owner, (0, 4), ISLANDS)


class Reports:
  def __init__(self):
    self.statuses: list[Status] = []
    self._event = threading.Event()

  def __call__(self, status: Status, *_) -> None:
    self.statuses.append(status)
    self._event.set()

  def wait(self) -> Status:
    assert self._event.wait(30), "no report within 30 s"
    self._event.clear()
    return self.statuses[-1]


def test_start_then_stop_writes_each_islands_launches(tmp_path):
  services, exe, reports = _services(), _executable(tmp_path), Reports()
  exe.launch(services, [], [], reports)
  gang, answer = services.dispatcher.gangs[0]
  assert [op.island for op in gang] == list(ISLANDS)
  assert services.dispatcher.action(0) == "start"
  answer(Status(), [b"", b""])
  assert reports.wait().ok

  exe.launch(services, [], [], reports)
  assert services.dispatcher.action(1) == "stop"
  services.dispatcher.gangs[1][1](
      Status(), [json.dumps(RECORDS[k]).encode() for k in ("0", "1")])
  assert reports.wait().ok
  run = tmp_path / "plugins" / "profile" / "run1"
  assert sorted(p.name for p in run.iterdir()) == [
      "island_0.xplane.pb", "island_1.xplane.pb"]
  data = jax.profiler.ProfileData.from_file(str(run / "island_1.xplane.pb"))
  lines = {line.name: [e.name for e in line.events]
           for line in data.find_plane_with_name("/device:CUSTOM:1").lines}
  assert lines == {"receive": ["receive"], "launch": ["jit_g"]}
  services.recording.claim(2)  # released: another client may profile

  with pytest.raises(StatusError, match="this profile is stopping"):
    exe.launch(services, [], [], reports)


def test_a_second_client_is_refused_until_the_first_leaves(tmp_path):
  services = _services()
  first, second = _executable(tmp_path, 1), _executable(tmp_path, 2)
  first.launch(services, [], [], None)
  with pytest.raises(StatusError, match="client 1 is profiling") as e:
    second.launch(services, [], [], None)
  assert e.value.status.code == Code.FAILED_PRECONDITION
  first.abandon(services)  # its client destroyed it or ended
  assert services.dispatcher.action(-1) == "stop"
  _executable(tmp_path, 2).launch(services, [], [], None)
  first.abandon(services)  # once only
  assert services.dispatcher.action(-1) == "start"


def test_failures_reach_the_client_and_free_the_islands(tmp_path):
  services, reports = _services(), Reports()
  exe = _executable(tmp_path)
  exe.launch(services, [], [], reports)
  services.dispatcher.gangs[0][1](Status(Code.DATA_LOSS, "island 1 lost"), [])
  assert reports.wait().code == Code.DATA_LOSS
  services.recording.claim(2)
  services.recording.release(2)

  (tmp_path / "plugins").write_text("a file where a folder must go")
  exe = _executable(tmp_path)
  exe.launch(services, [], [], reports)
  services.dispatcher.gangs[-1][1](Status(), [b"", b""])
  assert reports.wait().ok
  exe.launch(services, [], [], reports)
  services.dispatcher.gangs[-1][1](Status(), [b"[]", b"[]"])
  status = reports.wait()
  assert status.code == Code.FAILED_PRECONDITION
  assert "could not write the islands' traces" in status.message
