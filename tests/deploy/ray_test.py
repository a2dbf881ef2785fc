"""jax_pathways on Ray: a Ray cluster of three nodes on this machine
(ray.cluster_utils, one CPU each), a jax_pathways cluster of two islands
started on it by `jax-pathways ray start` (its actors outlive that
driver), a client that trains through it while a worker actor's process
is SIGKILLed, then another's SIGSTOPped (the controller drops it, its
actor is killed for Ray to restart). Ray restarts the actors, their new
workers take the islands back, training goes on (jax_pathways.elastic)
and ends with the same bits as plain JAX on CPU; `jax-pathways ray stop`
and the Ray cluster's shutdown leave no process behind."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest
import ray
from ray import cluster_utils

from jax_pathways import admin
from jax_pathways import cli
from jax_pathways import ray as on_ray
from jax_pathways.deploy.ray_actors import NAMESPACE

import processes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

RUN = os.path.join(os.path.dirname(__file__), "..", "elastic",
                   "training_run.py")
TOKEN = "ray-test-token"
ISLANDS, DEVICES = 2, 2


def _cli(workdir: str, *args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PATHWAYS_TOKEN=TOKEN)
  env.pop("JAX_PLATFORMS", None)
  return subprocess.run([sys.executable, "-m", "jax_pathways.cli", *args],
                        env=env, capture_output=True, text=True, timeout=180,
                        cwd=workdir)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> str:
  """Where the driver and the CLI run: an empty directory. Not the checkout
  (Ray puts its driver's directory on the actors' sys.path, and `-m`
  imports from the working directory: an unbuilt jax_pathways/ would
  shadow the installed one), nor /tmp, where a stray file named like a
  module does the same."""
  return str(tmp_path_factory.mktemp("ray_cwd"))


def _actor_processes() -> list[psutil.Process]:
  """This process's descendants that are jax_pathways actors (Ray names an
  actor's process ray::CLASS)."""
  return [p for p in psutil.Process().children(recursive=True)
          if p.cmdline()[:1] and
          p.cmdline()[0].startswith(("ray::_Controller", "ray::_Worker"))]


@pytest.fixture(scope="module")
def ray_nodes(workdir):
  """Three Ray nodes, shared by the module's tests (each stops the
  jax_pathways cluster it started); every process of theirs gone by pid at
  the end."""
  # Not the session's embedded cluster, if one runs.
  before = {p.pid for p in psutil.Process().children(recursive=True)}
  # A small object store each: nothing goes through it, and by default each
  # node would claim 30% of this machine's memory in /dev/shm.
  node = {"num_cpus": 1, "object_store_memory": 100 * 2**20}
  nodes = cluster_utils.Cluster(
      initialize_head=True,
      head_node_args=dict(node, include_dashboard=False))
  here = os.getcwd()
  try:
    for _ in range(2):
      nodes.add_node(**node)
    os.chdir(workdir)  # the actors' sys.path gets it
    try:
      ray.init(address=nodes.address, namespace=NAMESPACE,
               log_to_driver=False)
    finally:
      os.chdir(here)
    yield nodes
  finally:
    started = [p for p in psutil.Process().children(recursive=True)
               if p.pid not in before]
    ray.shutdown()
    nodes.shutdown()
    psutil.wait_procs(started, timeout=30)
    # psutil tells a process from a later one given its pid (start time).
    left = [p.pid for p in started
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"Ray processes outlived the cluster: {left}"


def test_trains_through_a_killed_worker_actor(ray_nodes, workdir):
  started = _cli(workdir, "ray", "start", "--ray-address",
                 ray_nodes.address,
                 "--islands", str(ISLANDS), "--devices-per-island",
                 str(DEVICES), "--cpus", "1", "--worker-timeout", "2")
  assert started.returncode == 0, started.stderr[-4000:]
  address = json.loads(started.stdout.strip().splitlines()[-1])["address"]
  actors: list[psutil.Process] = []
  try:
    cluster = on_ray.connect(initialize=False)  # this process has its own
    assert (cluster.address, cluster.token) == (address, TOKEN)
    assert TOKEN not in repr(cluster)
    # One island per node, neither on a node with the other.
    group = ray.util.get_placement_group(cluster.name)
    nodes = ray.util.placement_group_table(group)["bundles_to_node_id"]
    assert len(set(nodes.values())) == ISLANDS
    # The token reached the actors through Ray, not their command lines.
    actors = _actor_processes()
    assert len(actors) == ISLANDS + 1
    assert not any(TOKEN in " ".join(p.cmdline()) for p in actors)

    proc = subprocess.run(
        [sys.executable, RUN, json.dumps({
            "address": address, "token": TOKEN, "steps": 18,
            "commit_every": 4, "rejoin_timeout": 60.0,
            "faults": [[6, "kill", 1], [12, "stop", 0]],
            "cpu_reference": ISLANDS * DEVICES})],
        capture_output=True, text=True, timeout=240,
        cwd=workdir)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    killed, stopped = result["hurt"]
    assert not processes.alive(killed["pid"])
    assert not processes.alive(stopped["pid"])
    for event, island in zip(result["events"], (1, 0), strict=True):
      assert event["kind"] == "lost" and event["islands"] == [0, 1], event
      assert "DATA_LOSS" in event["error"], event
      # Ray may have the island back before the loop asks which are down.
      assert event["lost"] in ([island], []), event
    assert result["islands"] == [0, 1]
    assert result["params"] == result["cpu_reference"]

    # Each island's worker is the one its restarted actor runs (island 0's
    # only because its stopped actor was killed: Ray saw it live).
    islands = admin.status(address, TOKEN)["islands"]
    assert all(i["alive"] and i["restarts"] == 1 for i in islands), islands
    for i in range(ISLANDS):
      worker = ray.get_actor(f"{cluster.name}-island-{i}",
                             namespace=NAMESPACE)
      assert ray.get(worker.pid.remote(), timeout=30) == islands[i]["pid"]
    actors = _actor_processes()
  finally:
    stopped = _cli(workdir, "ray", "stop", "--ray-address", ray_nodes.address)
  assert stopped.returncode == 0, stopped.stderr[-4000:]
  assert "stopped 'jax-pathways'" in stopped.stdout, stopped.stdout
  psutil.wait_procs(actors, timeout=30)
  assert not [p.pid for p in actors if processes.alive(p.pid)]
  assert ray.util.placement_group_table(group)["state"] == "REMOVED"
  with pytest.raises(ValueError):
    ray.get_actor(on_ray.DEFAULT_NAME, namespace=NAMESPACE)


def test_workers_leave_with_their_controller(ray_nodes):
  """Workers whose controller is gone leave for good (Ray does not restart
  their actors); stop() then removes the placement group."""
  cluster = on_ray.start(ISLANDS, 1, {"CPU": 1, "memory": 2**26},
                         name="short-lived")
  try:
    actors = _actor_processes()
    assert len(actors) == ISLANDS + 1
    ray.kill(ray.get_actor(cluster.name, namespace=NAMESPACE))
    psutil.wait_procs(actors, timeout=60)
    time.sleep(2)  # time for a restart that must not come
    assert not [p.pid for p in actors if processes.alive(p.pid)]
    assert not _actor_processes()
  finally:
    assert on_ray.stop(cluster.name)
  assert not on_ray.stop(cluster.name)


def test_too_few_nodes_fail_at_once_unless_islands_may_share(ray_nodes):
  """A laptop's one-node Ray cluster: at 52b5207 start() waited 120 s and
  then failed on STRICT_SPREAD. Here 3 nodes, 4 islands: refused at once,
  saying what to do; side by side, two islands share a node."""
  with pytest.raises(on_ray.ClusterError,
                     match=r"4 islands need 4 Ray nodes .* has 3: add nodes "
                     r".*side_by_side=True"):
    on_ray.start(4, 1, {"CPU": 0.5}, name="too-wide", timeout_s=600)
  cluster = on_ray.start(ISLANDS, 1, {"CPU": 0.5}, name="side-by-side",
                         side_by_side=True, max_program_s=90)
  try:
    group = ray.util.get_placement_group(cluster.name)
    nodes = ray.util.placement_group_table(group)["bundles_to_node_id"]
    assert len(set(nodes.values())) == 1, nodes  # packed on one node
    status = admin.status(cluster.address, cluster.token)
    assert [i["alive"] for i in status["islands"]] == [True] * ISLANDS
    assert status["max_program_s"] == 90  # the controller's bound
  finally:
    assert on_ray.stop(cluster.name)


def test_a_bundle_must_reserve_something():
  with pytest.raises(ValueError, match="reserves nothing"):
    on_ray.start(resources_per_island={"CPU": 0})


def test_a_program_bound_must_be_positive():
  with pytest.raises(ValueError, match=r"max_program_s=0 must be > 0"):
    on_ray.start(max_program_s=0)


@pytest.mark.parametrize("flags, message", [
    (["--worker-timeout", "1"], "must be >= 2 seconds"),
    (["--resource", "accel"], "expected NAME=AMOUNT"),
    (["--max-program-seconds", "-1"], "--max-program-seconds=-1.0 must be > 0"),
])
def test_ray_start_checks_its_flags(flags, message, capsys):
  with pytest.raises(SystemExit) as exit_:
    cli.main(["ray", "start", *flags])
  assert exit_.value.code == 2
  assert message in capsys.readouterr().err


@pytest.mark.parametrize("code, restarted", [(0, False), (2, False),
                                             (1, True), (3, True)])
def test_only_a_worker_a_restart_can_help_is_restarted(monkeypatch, code,
                                                      restarted):
  """Exit 2 (a platform or device count this node lacks: worker/join.py)
  would fail the same way after every restart, for ever."""
  from jax_pathways.deploy import ray_actors as deploy_ray  # pylint: disable=import-outside-toplevel
  killed, left = [], []
  monkeypatch.setattr(deploy_ray.ray, "get_runtime_context",
                      lambda: type("Context", (), {"current_actor": "me"}))
  monkeypatch.setattr(deploy_ray.ray, "kill",
                      lambda actor, no_restart: killed.append(no_restart))
  monkeypatch.setattr(deploy_ray.time, "sleep", lambda _: None)
  monkeypatch.setattr(deploy_ray.os, "_exit", left.append)
  deploy_ray._leave(code)  # pylint: disable=protected-access
  assert left == [code]
  assert killed == ([] if restarted else [True])
