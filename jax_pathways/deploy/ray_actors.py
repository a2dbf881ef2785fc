"""Ray: a cluster's controller and island workers as actors on a Ray cluster.

    ray.init(address="auto")
    cluster = jax_pathways.ray.start(islands=2, devices_per_island=4,
                                     resources_per_island={"CPU": 4})
    jax_pathways.initialize(cluster.address, token=cluster.token)
    ...
    jax_pathways.ray.stop()

The controller is a named, detached actor; island i's worker is the actor
NAME-island-i in bundle i of a STRICT_SPREAD placement group, so no two
islands share a node. Both run in the actor's own process, not in a child
it would have to supervise: the process Ray kills, watches and restarts is
the worker itself, so a SIGKILLed actor leaves nothing behind, and Ray's
restart of the actor (`max_restarts`) is the worker's restart: the new
process joins the same island as its next generation. A worker the
controller dropped while its process lives (stopped, wedged), Ray would
never restart: the controller actor kills its actor for Ray to restart. A
worker that leaves on purpose (its controller stopped it or is gone) ends
its actor for good.
The controller is not restarted (a new one would know none of its clients'
arrays): a cluster whose controller died is stopped and started again.

The token is an actor argument: it travels through Ray, never on a command
line. Every address is the node's IP (Ray's), so the token is mandatory.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from typing import Any, Mapping

import ray
from absl import logging
from ray.util.placement_group import (PlacementGroup, get_placement_group,
                                      placement_group,
                                      remove_placement_group)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from jax_pathways import config
from jax_pathways import logs
from jax_pathways import threads
from jax_pathways.cluster import local_cluster
from jax_pathways.cluster import tokens

DEFAULT_NAME = "jax-pathways"
# Detached actors are found by name in this namespace, whatever the
# namespace of the driver that started them.
NAMESPACE = "jax_pathways"
# How often the controller actor looks for workers declared lost whose
# process lives; how long such a worker has to answer (a restarting actor
# answers once its new process runs, a stopped one never).
_LOSS_POLL_S = 1.0
_PID_TIMEOUT_S = 10.0


class ClusterError(RuntimeError):
  """The cluster could not start on Ray."""


@dataclasses.dataclass(frozen=True)
class Cluster:
  """A running cluster: what a client passes to `jax_pathways.initialize`."""
  name: str
  address: str  # grpc://NODE_IP:PORT
  token: str = dataclasses.field(repr=False)
  islands: int

  def stop(self) -> None:
    stop(self.name)


def _prepare_process() -> str:
  """Logging as the CLI's, no client JAX configuration; the node's IP."""
  # Not the client's JAX configuration of the environment `ray start` (or a
  # test) ran in.
  for key in local_cluster.CLIENT_ENV:
    os.environ.pop(key, None)
  logs.setup_logging(config.from_env().verbosity)
  return ray.util.get_node_ip_address()


@ray.remote
class _Controller:
  """The controller, serving in this actor's process until it is killed."""

  def __init__(self, name: str, islands: int, port: int, token: str,
               max_in_flight: int, worker_timeout_s: float | None,
               max_program_s: float | None, group: PlacementGroup):
    # pylint: disable=import-outside-toplevel
    from jax_pathways.cluster import host_registry
    from jax_pathways.controller.controller import Controller
    ip = _prepare_process()
    self._name = name
    self._token = token
    self._islands = islands
    self._placement_group = group
    self._controller = Controller(
        islands, f"{ip}:{port}", f"{ip}:0", f"{ip}:0", token, max_in_flight,
        worker_timeout_s=worker_timeout_s, max_program_s=max_program_s)
    self._controller.start()
    # `jax-pathways status` on this node finds it; the entry of a killed
    # actor is dropped by the next reader (its pid is gone).
    host_registry.add("controller", self._controller.address, token)
    threads.start(self._kill_lost, "jp-ray-kill-lost")

  def _kill_lost(self) -> None:
    """Has Ray restart the actor of a worker the controller declared lost
    while its process lives (stopped, or wedged past --worker-timeout): Ray
    sees a live process and would leave the island lost. A worker that
    answers with another pid is the lost one's successor, already there."""
    handled: dict[int, int] = {}  # island -> the lost worker's pid
    while True:
      time.sleep(_LOSS_POLL_S)
      for island in self._controller.status()["islands"]:
        i, pid = island["island"], island["pid"]
        if island["alive"] or island["joining"] or handled.get(i) == pid:
          continue
        handled[i] = pid
        worker = _actor(_worker_name(self._name, i))
        if worker is None:  # it left for good
          continue
        try:
          if ray.get(worker.pid.remote(), timeout=_PID_TIMEOUT_S) != pid:
            continue
        except ray.exceptions.GetTimeoutError:
          pass  # stopped: it cannot answer
        except ray.exceptions.RayActorError:
          continue  # dead: Ray restarts it, or it left
        logging.warning("the controller declared island %d's worker (pid "
                        "%d) lost, but its process lives: killing its actor "
                        "for Ray to restart (%s)", i, pid, island["last_lost"])
        ray.kill(worker, no_restart=False)

  def connection(self) -> dict[str, Any]:
    return {"address": f"grpc://{self._controller.address}",
            "worker_address": self._controller.worker_address,
            "token": self._token,
            "islands": self._islands}

  def complete(self) -> bool:
    """Whether every island's worker has joined."""
    return bool(self._controller.status()["complete"])

  def placement_group(self) -> PlacementGroup:
    return self._placement_group


def _leave(code: int) -> None:
  """Ends the actor: for good if its worker left on purpose (code 0: its
  controller stopped it or is gone) or can never start here (EXIT_SETUP:
  restarted, it would fail the same way for ever); else Ray restarts it,
  and its new worker takes the island's place (its next generation)."""
  from jax_pathways.worker import join  # pylint: disable=import-outside-toplevel
  if code in (0, join.EXIT_SETUP):
    if code:
      logging.error("worker cannot start on this node (exit code %d, see "
                    "the lines above); its actor ends without a restart: "
                    "fix the node or the flags and start the cluster "
                    "again", code)
    else:
      logging.info("worker left; its actor ends")
    ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
    # Ray ends this process; a live actor with no worker must not stay.
    time.sleep(_PID_TIMEOUT_S)
  else:
    logging.warning("worker exited with code %d; Ray restarts its actor",
                    code)
  os._exit(code)  # pylint: disable=protected-access


@ray.remote
class _Worker:
  """Island `island`'s worker, running in this actor's process."""

  def __init__(self, name: str, controller: str, island: int, devices: int,
               token: str, controller_timeout_s: float,
               storage_root: str | None, colocated_python: bool):
    ip = _prepare_process()
    # The actor's methods stay free to answer while the worker serves.
    threads.start(self._serve, "jp-ray-worker", name, controller, island,
                  devices, token, ip, controller_timeout_s, storage_root,
                  colocated_python)

  @staticmethod
  def _serve(name: str, controller: str, island: int, devices: int,
             token: str, ip: str, controller_timeout_s: float,
             storage_root: str | None, colocated_python: bool) -> None:
    from jax_pathways.worker import join  # pylint: disable=import-outside-toplevel
    if _actor(name) is None:
      _leave(0)  # restarted after its controller's actor died
    try:
      code = join.run(controller, island, devices, token, f"{ip}:0",
                      connect_timeout=60.0,
                      controller_timeout=controller_timeout_s,
                      storage_root=storage_root,
                      colocated_python=colocated_python)
    except BaseException:  # pylint: disable=broad-except
      logging.exception("worker of island %d failed", island)
      code = 1
    if code != 0 and _actor(name) is None:
      # Its controller's actor is gone (this may be the restart of a worker
      # that lost it): no worker could join again.
      code = 0
    _leave(code)

  def pid(self) -> int:
    return os.getpid()


def _connect(ray_address: str | None) -> None:
  if not ray.is_initialized():
    ray.init(address=ray_address or "auto", namespace=NAMESPACE,
             log_to_driver=False)


def _actor_options(resources: Mapping[str, float]) -> dict[str, Any]:
  """An actor's options reserving a bundle's `resources` (Ray names CPUs,
  GPUs and memory in options of their own, others in `resources`)."""
  rest = {k: v for k, v in resources.items()
          if k not in ("CPU", "GPU", "memory")}
  return {"num_cpus": resources.get("CPU", 0),
          "num_gpus": resources.get("GPU", 0),
          "memory": resources.get("memory"), "resources": rest}


def _worker_name(name: str, island: int) -> str:
  return f"{name}-island-{island}"


def _actor(name: str) -> Any | None:
  try:
    return ray.get_actor(name, namespace=NAMESPACE)
  except ValueError:
    return None


def start(islands: int = 2,
          devices_per_island: int = config.DEFAULT_DEVICES_PER_ISLAND,
          resources_per_island: Mapping[str, float] | None = None, *,
          name: str = DEFAULT_NAME,
          controller_resources: Mapping[str, float] | None = None,
          port: int = 0, token: str | None = None, max_restarts: int = -1,
          max_in_flight: int = config.DEFAULT_MAX_IN_FLIGHT,
          worker_timeout_s: float | None = None,
          max_program_s: float | None = None,
          controller_timeout_s: float = config.DEFAULT_CONTROLLER_TIMEOUT,
          ray_address: str | None = None,
          timeout_s: float = config.DEFAULT_START_TIMEOUT,
          side_by_side: bool = False,
          storage_root: str | None = None,
          colocated_python: bool = False) -> Cluster:
  """Starts a cluster on Ray; returns once every island's worker has joined.

  Args:
    islands: island workers, one per node.
    devices_per_island: each worker's devices.
    resources_per_island: what each island's bundle (and worker actor)
      reserves on its node: "CPU", "GPU", custom resources (default 1 CPU).
    name: the controller actor's name; the workers' are NAME-island-I.
    controller_resources: the controller actor's (default 1 CPU).
    port: the client port on the controller's node (0: any free one).
    token: the cluster token (default: a fresh one).
    max_restarts: Ray's restarts of each worker actor (-1: no limit).
    max_in_flight, worker_timeout_s, max_program_s: the controller's
      --max-in-flight, --worker-timeout and --max-program-seconds (None:
      programs hold their island as long as they run);
      controller_timeout_s: the workers' --controller-timeout.
    ray_address: ray.init's address if Ray is not initialized yet
      (default "auto": the cluster of this node, or $RAY_ADDRESS).
    timeout_s: for the placement group and the workers to join.
    side_by_side: let islands share a node (a laptop's one-node Ray
      cluster; bundles packed where they fit). Default: one island per
      node, and fewer nodes than islands is an error at once.
    storage_root: where the workers save and restore arrays for
      persistence requests (docs/storage.md): a directory every node mounts
      at the same path, or a gs:// or s3:// prefix; None: refused.
    colocated_python: let clients run colocated_python functions on the
      workers' nodes (docs/colocated_python.md); default: refused.
  """
  resources = dict({"CPU": 1} if resources_per_island is None
                   else resources_per_island)
  if not any(v > 0 for v in resources.values()):
    raise ValueError(f"resources_per_island={resources} reserves nothing; "
                     "Ray places bundles by what they reserve: give e.g. "
                     "{'CPU': 1}")
  if islands < 1:
    raise ValueError(f"islands={islands} must be at least 1")
  config.max_program_seconds(max_program_s, "max_program_s")
  _connect(ray_address)
  if _actor(name) is not None:
    raise ClusterError(f"a cluster named {name!r} runs on this Ray cluster; "
                       f"stop it first (jax_pathways.ray.stop({name!r}) or "
                       f"`jax-pathways ray stop --name {name}`)")
  nodes = [n for n in ray.nodes() if n["Alive"]]
  if not side_by_side and len(nodes) < islands:
    raise ClusterError(
        f"{islands} islands need {islands} Ray nodes (one island each), and "
        f"this Ray cluster has {len(nodes)}: add nodes (`ray start "
        f"--address=...` on other hosts), or let islands share a node "
        f"(side_by_side=True; `jax-pathways ray start --side-by-side`)")
  token = token or tokens.new()
  deadline = time.monotonic() + timeout_s
  strategy = "PACK" if side_by_side else "STRICT_SPREAD"
  group = placement_group(
      [resources] * islands, strategy=strategy, name=name,
      lifetime="detached")
  try:
    if not group.wait(timeout_seconds=timeout_s):
      raise ClusterError(
          f"Ray could not place {islands} islands of {resources} each "
          + ("" if side_by_side else f"on {islands} different nodes ") +
          f"within {timeout_s:.0f} s ({strategy}); the nodes' resources: "
          f"{[n['Resources'] for n in ray.nodes() if n['Alive']]}")
    controller = _Controller.options(
        name=name, namespace=NAMESPACE, lifetime="detached", max_restarts=0,
        **_actor_options(controller_resources or {"CPU": 1})).remote(
            name, islands, port, token, max_in_flight, worker_timeout_s,
            max_program_s, group)
    info = ray.get(controller.connection.remote(),
                   timeout=max(1.0, deadline - time.monotonic()))
    for i in range(islands):
      _Worker.options(
          name=_worker_name(name, i), namespace=NAMESPACE,
          lifetime="detached", max_restarts=max_restarts,
          scheduling_strategy=PlacementGroupSchedulingStrategy(
              group, placement_group_bundle_index=i),
          **_actor_options(resources)).remote(
              name, info["worker_address"], i, devices_per_island, token,
              controller_timeout_s, storage_root, colocated_python)
    while not ray.get(controller.complete.remote()):
      if time.monotonic() > deadline:
        raise ClusterError(
            f"the workers did not all join within {timeout_s:.0f} s; their "
            "logs are Ray's (the session's logs/ folder on each node)")
      time.sleep(0.2)
  except BaseException:
    _teardown(name, _actor(name), group)
    raise
  logging.info("jax_pathways on Ray: %s, %d islands x %d devices at %s",
               name, islands, devices_per_island, info["address"])
  return Cluster(name, info["address"], token, islands)


def connect(name: str = DEFAULT_NAME, ray_address: str | None = None, *,
            initialize: bool = True) -> Cluster:
  """Connects this process's JAX to the running cluster `name` (its
  address and token asked of its controller through Ray): a training
  script on any node, or a Ray task, needs nothing else. initialize=False
  only finds the cluster; jax_pathways.initialize(cluster.address,
  token=cluster.token) connects JAX later."""
  _connect(ray_address)
  controller = _actor(name)
  if controller is None:
    raise ClusterError(f"no cluster named {name!r} runs on this Ray cluster")
  info = ray.get(controller.connection.remote())
  cluster = Cluster(name, info["address"], info["token"], info["islands"])
  if initialize:
    import jax_pathways  # pylint: disable=import-outside-toplevel
    jax_pathways.initialize(cluster.address, token=cluster.token)
  return cluster


def stop(name: str = DEFAULT_NAME, ray_address: str | None = None) -> bool:
  """Kills the cluster's actors and removes its placement group; False if
  there was none. Returns once Ray has taken the actors down."""
  _connect(ray_address)
  controller = _actor(name)
  group = None
  if controller is not None:
    # It died: the group is found by name.
    with contextlib.suppress(ray.exceptions.RayError):
      group = ray.get(controller.placement_group.remote(), timeout=30)
  if group is None:
    with contextlib.suppress(ValueError):
      group = get_placement_group(name)
  return _teardown(name, controller, group)


def _teardown(name: str, controller: Any | None,
              group: PlacementGroup | None) -> bool:
  # A group has a bundle per island, each with that island's worker.
  islands = group.bundle_count if group is not None else 0
  found = [_actor(_worker_name(name, i)) for i in range(islands)]
  actors = [a for a in found + [controller] if a is not None]
  for actor in actors:
    ray.kill(actor, no_restart=True)
  for actor in actors:
    _wait_dead(actor)
  if group is not None:
    remove_placement_group(group)
  return bool(actors) or group is not None


def _wait_dead(actor: Any, timeout_s: float = 30.0) -> None:
  """Until a call to `actor` fails as Ray's calls to a dead actor do."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    try:
      ray.get(actor.__ray_ready__.remote(), timeout=5)
    except ray.exceptions.RayActorError:
      return
    except ray.exceptions.GetTimeoutError:
      pass
    time.sleep(0.1)
  logging.warning("a jax_pathways actor was still up %.0f s after "
                  "ray.kill", timeout_s)
