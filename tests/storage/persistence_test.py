"""Persistence requests through the session's cluster, as users send them:
pathwaysutils' helper and orbax's Pathways handler save and restore arrays
spanning both islands with no byte through this process; plain orbax in one
process reads what the workers wrote, and the reverse (OCDBT too)."""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from pathwaysutils.persistence import helper

import checkpoints
import processes
import state

pytestmark = pytest.mark.integration

TIMEOUT = datetime.timedelta(seconds=120)


@pytest.fixture(scope="module")
def mesh(pathways) -> Mesh:
  return Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))


def _write(path, arrays: dict) -> None:
  names = sorted(arrays)
  helper.write_arrays(str(path), names, [arrays[n] for n in names],
                      TIMEOUT).result(timeout=120)


def _read(path, arrays: dict, shardings: dict, devices) -> dict:
  names = sorted(arrays)
  read, done = helper.read_arrays(
      str(path), names, [arrays[n].dtype for n in names],
      [arrays[n].shape for n in names], [shardings[n] for n in names],
      devices, TIMEOUT)
  done.result(timeout=120)
  return dict(zip(names, read))


def test_pathwaysutils_writes_and_reads_arrays_on_both_islands(tmp_path, mesh):
  values = state.values()
  arrays = checkpoints.put(values, mesh, "saved")
  _write(tmp_path, arrays)
  # An array of island 1 alone (a bulk request's arrays share devices).
  island1 = Mesh(np.array(jax.devices()[4:]), ("i",))
  one = {"one": jax.device_put(np.arange(12.0), NamedSharding(island1,
                                                              P("i")))}
  _write(tmp_path, one)
  assert sorted(os.listdir(tmp_path)) == sorted([*arrays, "one"])
  # Onto other shardings: each island reads the slices its devices hold.
  others = {n: NamedSharding(mesh, state.spec_of(values[n], "other"))
            for n in values}
  island0 = Mesh(np.array(jax.devices()[:4]), ("i",))
  for expected, shardings, devices in [
      (arrays, others, mesh.devices),
      (one, {"one": NamedSharding(island0, P())}, island0.devices)]:
    for n, a in _read(tmp_path, expected, shardings, devices).items():
      assert a.sharding == shardings[n]
      assert np.asarray(a).tobytes() == np.asarray(expected[n]).tobytes(), n


def test_a_failed_read_fails_its_token_and_names_the_array(tmp_path, mesh):
  x = jax.device_put(np.ones((8, 8), np.float32), NamedSharding(mesh, P()))
  helper.write_arrays(str(tmp_path), ["x"], [x], TIMEOUT).result(timeout=120)
  cases = {"missing": (np.float32, (8, 8)), "x": (np.int32, (8, 8))}
  for name, (dtype, shape) in cases.items():
    read, done = helper.read_arrays(
        str(tmp_path), [name], [np.dtype(dtype)], [shape],
        [NamedSharding(mesh, P())], mesh.devices, TIMEOUT)
    with pytest.raises(Exception, match=f"restoring array '{name}'|"
                       r"holds float32\[8, 8\]") as e:
      done.result(timeout=120)
    with pytest.raises(Exception, match=str(e.value)[:40].replace("[", ".")):
      np.asarray(read[0])  # the array holds the same error


@pytest.mark.parametrize("request_json", [
    '{"persistenceWriteRequest": []}',
    '{"bulk_persistence_read_request": {"read_requests": [7]}}',
    '{"persistenceReadRequest": ' + '[' * 50000 + ']' * 50000 + '}',
])
def test_malformed_requests_are_refused_and_the_islands_serve_on(
    pathways, request_json):
  pids = pathways.pids
  with pytest.raises(Exception, match="INVALID_ARGUMENT|UNIMPLEMENTED"):
    helper.plugin_executable.PluginExecutable(request_json)
  assert pathways.pids == pids and all(processes.alive(p) for p in pids)
  assert float(jax.jit(lambda v: v.sum())(jnp.arange(4.0))) == 6.0


@pytest.fixture
def pathways_handlers(monkeypatch):
  monkeypatch.setenv("ENABLE_PATHWAYS_PERSISTENCE", "1")
  with checkpoints.pathways_handlers(
      ocp.pathways.CheckpointingImpl.PERSISTENCE):
    yield


def test_orbax_saves_and_restores_through_the_workers_and_plain_orbax_agrees(
    tmp_path, mesh, pathways_handlers):
  values = state.values()
  manager = ocp.CheckpointManager(
      tmp_path / "workers",
      options=ocp.CheckpointManagerOptions(enable_async_checkpointing=True),
      item_handlers=ocp.PyTreeCheckpointHandler(use_ocdbt=False))
  manager.save(1, args=ocp.args.PyTreeSave(
      checkpoints.put(values, mesh, "saved")))
  manager.wait_until_finished()
  everything = dict.fromkeys(values, True)
  assert checkpoints.restore(tmp_path / "workers", mesh) == everything
  # Plain orbax in one process reads what the workers wrote ...
  assert checkpoints.plain("read", str(tmp_path / "workers")) == everything
  # ... and the workers read what plain orbax wrote, with OCDBT or without.
  for ocdbt in ("0", "1"):
    path = str(tmp_path / f"plain{ocdbt}")
    saved = checkpoints.plain("write", path, ocdbt)["saved"]
    assert ("manifest.ocdbt" in saved) == (ocdbt == "1")
    assert checkpoints.restore(path, mesh) == dict.fromkeys(values, True)


def test_a_client_capped_below_its_state_saves_and_restores_it(
    pathways, tmp_path):
  """The client's address space is capped, once warmed up, at 384 MiB more
  than it has (room for its threads' stacks): it cannot hold its 768 MiB
  state (it tries), yet saves and restores it bit for bit."""
  assert checkpoints.capped(pathways, tmp_path, 768, 384, "PERSISTENCE") == {
      "equal": True, "could_hold_state": False,
      "restored_sharding_same": True}


@pytest.fixture(scope="module")
def confined_cluster(tmp_path_factory):
  """A cluster of its own whose workers may store under `root` only."""
  from jax_pathways.cluster.local_cluster import LocalCluster  # pylint: disable=import-outside-toplevel
  root = tmp_path_factory.mktemp("root")
  with processes.running(LocalCluster(2, 2, 16,
                                      storage_root=str(root))) as cluster:
    yield cluster, root


def test_workers_store_under_their_root_only(confined_cluster, tmp_path):
  cluster, root = confined_cluster
  outside = tmp_path / "outside"
  outside.mkdir()
  pids = cluster.pids
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)
  env.update(JAX_PATHWAYS_ADDRESS=cluster.address,
             JAX_PATHWAYS_TOKEN=cluster.token)
  script = os.path.join(os.path.dirname(__file__), "confined_client.py")
  out = subprocess.run([sys.executable, script, str(root), str(outside)],
                       env=env, cwd="/", capture_output=True, text=True,
                       timeout=240, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  got = json.loads(out.stdout.splitlines()[-1])
  assert got.pop("inside") == got.pop("read_inside") == "ok"
  assert got.pop("still_serves") is True
  for case in ("outside", "read_outside"):
    assert "PERMISSION_DENIED" in got[case], got
    assert f"'{outside}/x' is outside the storage root '{root}'" in got[case]
  assert "PERMISSION_DENIED" in got["through_link"], got
  assert f"-> {outside}/x" in got["through_link"], got
  assert "INVALID_ARGUMENT" in got["dotdot"], got
  assert "not a plain path" in got["dotdot"], got
  assert not os.listdir(outside)  # nothing got out
  assert cluster.pids == pids and all(processes.alive(p) for p in pids)
