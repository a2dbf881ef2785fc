"""Kubernetes manifests of a cluster: a JobSet, its Service, Secret and
NetworkPolicy, as plain objects and as YAML for `kubectl apply`.

    jax-pathways k8s --image IMAGE --islands 4 | kubectl apply -f -

The JobSet (jobset.x-k8s.io/v1alpha2; the JobSet controller must be
installed) has the shape Pathways on Cloud uses: a `controller` replicated
job of one pod, started first (startupPolicy InOrder: the workers are
created once it is ready, i.e. answers `jax-pathways status`), and a
`worker` replicated job with one Job per island (replicas = islands); each
worker takes the island of its Job's index.

Restarts. A worker pod runs `jax-pathways worker --restart-in-place`
(worker/in_place.py), which starts the worker again inside the pod when it
crashes or the controller dropped it (worker/join.py's exit codes), with the
embedded cluster's limits per incident (cluster/restarts.py), keeping its
compilation cache volume; the new process takes its island back as the
island's next generation. The pod itself never restarts (restartPolicy
Never, which a pod failure policy needs): a worker that cannot start on its
host (exit 2) fails the JobSet at once instead of looping, an incident given
up on in place makes a new pod (the Job's backoffLimit, `worker_restarts`,
counts those), and a pod evicted or preempted is replaced without counting.
The controller is not restarted (backoffLimit 0): a new controller knows
none of the clients' arrays and the workers would not all find it, so its
failure, or a worker Job's, recreates the whole JobSet (up to
`max_restarts` times; JobSet's failurePolicy). A worker exits 0 only when
its controller stopped it or is gone; the JobSet completes when the
controller does (drained with SIGUSR1, or stopped).

Addresses. Clients reach the controller through the Service
`<name>-controller` (the client port only). Workers join it at its pod's
JobSet DNS name `<name>-controller-0-0.<name>`, which does not depend on
the Service's readiness-gated endpoints. The coordination service and each
worker's data port listen on the pod's IP, since the controller and the
workers hand those addresses to other pods (IPv4 pod networks).
The NetworkPolicy lets the cluster's pods reach each other on any port and
everyone else only the client port: the coordination service and gloo
cannot authenticate (docs/security.md).

The token lives in a Secret and reaches every process as JAX_PATHWAYS_TOKEN
(secretKeyRef), never on a command line; every address is off loopback, so
the controller requires it.

A worker process is one island: islands spanning several hosts do not exist
yet, so every worker Job runs one pod (completions = parallelism = 1).
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import yaml

from jax_pathways import config
from jax_pathways.cluster import tokens
from jax_pathways.storage import paths
from jax_pathways.worker import join as worker_main

JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
CONTROLLER = "controller"  # the replicated jobs' names
WORKER = "worker"
TOKEN_KEY = "token"  # the token's key in the Secret
# A GPU worker's defaults, per GPU of its pod.
CPU_PER_GPU = 8
MEMORY_GIB_PER_GPU = 32
# Where the pods may write, their root filesystem being read-only.
TMP = "/tmp"
CACHE_DIR = "/var/cache/jax-pathways"
# Where a storage claim is mounted on every worker: the workers' storage
# root (docs/storage.md).
STORAGE_DIR = "/var/lib/jax-pathways/storage"
# JobSet labels every pod with its Job's index in its replicated job.
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
# Environment variables the commands refer to as $(NAME) (kubelet expands
# them from the container's env).
POD_IP = "POD_IP"
JOB_INDEX = "JOB_INDEX"
ALL_ADDRESSES = "0.0.0.0"
# Pod names are DNS labels: JobSet refuses a JobSet whose pod names, the
# hostname and Kubernetes' 6-character suffix, would not fit in one.
_MAX_LABEL = 63
_POD_NAME_SUFFIX = len("-abcde")
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
# Kubernetes resource quantities: 500m, 4, 1.5, 16Gi, 8G.
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")


@dataclasses.dataclass(frozen=True)
class Spec:
  """A cluster to render. Ports: `port` for clients, port+1 where workers
  join, port+2 the coordination service, port+3 the workers' data."""
  image: str
  name: str = "jax-pathways"
  namespace: str | None = None  # None: kubectl's current namespace
  islands: int = config.DEFAULT_ISLANDS
  # None: --gpus if given, else config.DEFAULT_DEVICES_PER_ISLAND.
  devices_per_island: int | None = None
  cpu: str | None = None  # per worker, request and limit; None: per GPU
  memory: str | None = None  # ... (CPU_PER_GPU, MEMORY_GIB_PER_GPU)
  gpus: int = 0  # nvidia.com/gpu per worker; > 0: CUDA islands
  controller_cpu: str = "2"
  controller_memory: str = "4Gi"
  port: int = 8470
  token_secret: str | None = None  # an existing Secret; None: render one
  # New pods per worker Job (its backoffLimit): each after an incident
  # given up on in place, or a pod lost with its node.
  worker_restarts: int = 10
  max_restarts: int = 3  # of the whole JobSet
  run_as_user: int = 1000  # the pods' uid and gid (never root)
  # A PersistentVolumeClaim for the workers' compilation cache; None: an
  # emptyDir, which lives as long as the pod (restarts in place keep it).
  cache_pvc: str | None = None
  # Where the workers save and restore arrays (docs/storage.md): a
  # ReadWriteMany PersistentVolumeClaim every worker mounts at STORAGE_DIR,
  # or a gs:// or s3:// prefix; neither: persistence requests are refused.
  storage_pvc: str | None = None
  storage_root: str | None = None
  # Whether clients may run colocated_python functions on the workers
  # (docs/colocated_python.md): their code, as the pods' user.
  colocated_python: bool = False
  # The controller's --max-program-seconds: how long a program may hold its
  # island before the island is taken back (None: as long as it runs).
  max_program_seconds: float | None = None

  def __post_init__(self) -> None:
    # Defaults that depend on --gpus (a frozen dataclass: set once, here).
    if self.gpus < 0:
      raise ValueError(f"--gpus={self.gpus} must be >= 0")
    defaults = {
        "devices_per_island": self.gpus or config.DEFAULT_DEVICES_PER_ISLAND,
        "cpu": str(CPU_PER_GPU * self.gpus) if self.gpus else "4",
        "memory": (f"{MEMORY_GIB_PER_GPU * self.gpus}Gi" if self.gpus
                   else "8Gi")}
    for field, value in defaults.items():
      if getattr(self, field) is None:
        object.__setattr__(self, field, value)
    longest = self.controller_hostname  # longer than any worker's
    if (not _DNS_LABEL.fullmatch(self.name) or
        len(longest) + _POD_NAME_SUFFIX > _MAX_LABEL):
      raise ValueError(
          f"--name={self.name!r} must be lowercase letters, digits and '-', "
          f"start with a letter, and keep pod names such as "
          f"'{longest}-abcde' within {_MAX_LABEL} characters")
    if self.namespace is not None and not _DNS_LABEL.fullmatch(self.namespace):
      raise ValueError(f"--namespace={self.namespace!r} is not a namespace "
                       "name (lowercase letters, digits and '-')")
    if not self.image or any(c.isspace() for c in self.image):
      raise ValueError(f"--image={self.image!r} must name an image, e.g. "
                       "registry.example.com/jax-pathways:0.1.0")
    config.max_program_seconds(self.max_program_seconds,
                               "--max-program-seconds")
    if not 1 <= self.islands <= 64:  # what a controller accepts (config.py)
      raise ValueError(f"--islands={self.islands} must be in 1..64")
    if not 1 <= self.devices_per_island <= 1024:
      raise ValueError(f"--devices-per-island={self.devices_per_island} "
                       "must be in 1..1024")
    for flag, value in (("--cpu", self.cpu), ("--memory", self.memory),
                        ("--controller-cpu", self.controller_cpu),
                        ("--controller-memory", self.controller_memory)):
      if not _QUANTITY.fullmatch(value):
        raise ValueError(f"{flag}={value!r} is not a Kubernetes quantity "
                         "such as 500m, 4, 8Gi or 16G")
    if self.gpus and self.devices_per_island != self.gpus:
      raise ValueError(
          f"--devices-per-island={self.devices_per_island} with "
          f"--gpus={self.gpus}: a GPU worker's island is every GPU of its "
          f"pod; give both the same number")
    if not 1 <= self.port <= 65535 - 3:
      raise ValueError(f"--port={self.port} must be in 1..65532 (the "
                       "cluster uses it and the next three)")
    if self.token_secret is not None and not re.fullmatch(
        r"[a-z0-9]([-.a-z0-9]*[a-z0-9])?", self.token_secret):
      raise ValueError(f"--token-secret={self.token_secret!r} is not a "
                       "Secret's name")
    if self.worker_restarts < 0 or self.max_restarts < 0:
      raise ValueError(f"--worker-restarts={self.worker_restarts} and "
                       f"--max-restarts={self.max_restarts} must be >= 0")
    if not 1 <= self.run_as_user < 2**31:
      raise ValueError(f"--run-as-user={self.run_as_user} must be a uid "
                       "other than root's (1 or more)")
    if self.cache_pvc is not None and not _DNS_LABEL.fullmatch(
        self.cache_pvc):
      raise ValueError(f"--cache-pvc={self.cache_pvc!r} is not a claim's "
                       "name")
    if self.storage_pvc is not None and not _DNS_LABEL.fullmatch(
        self.storage_pvc):
      raise ValueError(f"--storage-pvc={self.storage_pvc!r} is not a "
                       "claim's name")
    if self.storage_root is not None and (
        self.storage_pvc is not None or
        not self.storage_root.startswith(paths.URL_SCHEMES) or
        any(c.isspace() for c in self.storage_root)):
      raise ValueError(
          f"--storage-root={self.storage_root!r} must be a "
          f"{' or '.join(paths.URL_SCHEMES)} prefix, and not given with "
          "--storage-pvc (which mounts the workers' root)")

  @property
  def worker_storage_root(self) -> str | None:
    """The workers' --storage-root."""
    return STORAGE_DIR if self.storage_pvc else self.storage_root

  @property
  def worker_port(self) -> int:
    return self.port + 1

  @property
  def coordinator_port(self) -> int:
    return self.port + 2

  @property
  def data_port(self) -> int:
    return self.port + 3

  @property
  def service(self) -> str:
    # Not `name`: JobSet gives its headless Service (the subdomain) that one.
    return f"{self.name}-{CONTROLLER}"

  @property
  def secret(self) -> str:
    return self.token_secret or f"{self.name}-token"

  @property
  def controller_hostname(self) -> str:
    """JobSet's hostname of the controller's pod: <JobSet>-<replicated
    job>-<Job index>-<pod index>."""
    return f"{self.name}-{CONTROLLER}-0-0"

  @property
  def controller_address(self) -> str:
    """Where workers join: the controller pod's name in JobSet's DNS
    (<hostname>.<subdomain>, the subdomain being the JobSet's name)."""
    return f"{self.controller_hostname}.{self.name}:{self.worker_port}"


def token_path(spec: Spec) -> str:
  """Where `jax-pathways k8s` keeps the token of the cluster `spec` names:
  one per namespace and name, so that rendering again gives the same
  Secret (a new token under running pods would lock out restarted ones)."""
  return os.path.join(os.path.dirname(tokens.default_path()), "k8s",
                      f"{spec.namespace or '_'}.{spec.name}.token")


def manifests(spec: Spec, token: str | None = None) -> list[dict[str, Any]]:
  """The cluster's objects, in the order to apply them. The Secret (with
  `token`, or a fresh one) only when spec.token_secret names none."""
  objects = []
  if spec.token_secret is None:
    objects.append(secret(spec, token or tokens.new()))
  return objects + [service(spec), network_policy(spec), jobset(spec)]


class _Dumper(yaml.SafeDumper):
  """Writes a value that occurs twice twice, not as an anchor and alias."""

  def ignore_aliases(self, data: Any) -> bool:
    return True


def to_yaml(objects: list[dict[str, Any]]) -> str:
  return yaml.dump_all(objects, Dumper=_Dumper, explicit_start=True,
                       sort_keys=False)


def write(objects: list[dict[str, Any]], directory: str) -> list[str]:
  """One file per object in `directory` (`kubectl apply -f DIRECTORY`);
  the Secret's readable by its owner only. Returns the paths."""
  os.makedirs(directory, exist_ok=True)
  paths = []
  # Numbered: `kubectl apply -f DIRECTORY` applies files in name order, and
  # the JobSet's pods need the Secret first.
  for i, obj in enumerate(objects):
    path = os.path.join(directory, f"{i:02d}-{obj['kind'].lower()}.yaml")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
      os.fchmod(f.fileno(), 0o600 if obj["kind"] == "Secret" else 0o644)
      f.write(to_yaml([obj]))
    paths.append(path)
  return paths


def labels(spec: Spec, component: str | None = None) -> dict[str, str]:
  """The labels of the cluster's objects; `component`: of its pods."""
  out = {"app.kubernetes.io/name": "jax-pathways",
         "app.kubernetes.io/instance": spec.name}
  if component:
    out["app.kubernetes.io/component"] = component
  return out


def _metadata(spec: Spec, name: str, component: str | None = None
              ) -> dict[str, Any]:
  meta: dict[str, Any] = {"name": name, "labels": labels(spec, component)}
  if spec.namespace:
    meta["namespace"] = spec.namespace
  return meta


def secret(spec: Spec, token: str) -> dict[str, Any]:
  return {"apiVersion": "v1", "kind": "Secret",
          "metadata": _metadata(spec, spec.secret), "type": "Opaque",
          "stringData": {TOKEN_KEY: token}}


def service(spec: Spec) -> dict[str, Any]:
  """The client port of the controller, for clients in the cluster and
  `kubectl port-forward`."""
  return {"apiVersion": "v1", "kind": "Service",
          "metadata": _metadata(spec, spec.service, CONTROLLER),
          "spec": {"type": "ClusterIP",
                   "selector": labels(spec, CONTROLLER),
                   "ports": [{"name": "client", "port": spec.port,
                              "targetPort": "client", "protocol": "TCP"}]}}


def network_policy(spec: Spec) -> dict[str, Any]:
  """Any port between the cluster's pods (gloo's ports are random), only
  the client port from elsewhere."""
  return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
          "metadata": _metadata(spec, spec.name),
          "spec": {"podSelector": {"matchLabels": labels(spec)},
                   "policyTypes": ["Ingress"],
                   "ingress": [
                       {"from": [{"podSelector":
                                  {"matchLabels": labels(spec)}}]},
                       {"ports": [{"port": spec.port, "protocol": "TCP"}]}]}}


def jobset(spec: Spec) -> dict[str, Any]:
  return {"apiVersion": JOBSET_API_VERSION, "kind": "JobSet",
          "metadata": _metadata(spec, spec.name),
          "spec": {
              "network": {"enableDNSHostnames": True, "subdomain": spec.name},
              "startupPolicy": {"startupPolicyOrder": "InOrder"},
              "successPolicy": {"operator": "All",
                                "targetReplicatedJobs": [CONTROLLER]},
              "failurePolicy": {
                  "maxRestarts": spec.max_restarts,
                  # A worker that cannot start here (its pod failure
                  # policy) would fail the same way in a new JobSet.
                  "rules": [{"name": "worker-cannot-start",
                             "action": "FailJobSet",
                             "onJobFailureReasons": ["PodFailurePolicy"],
                             "targetReplicatedJobs": [WORKER]}]},
              "replicatedJobs": [
                  {"name": CONTROLLER, "replicas": 1,
                   "template": _job(spec, CONTROLLER, _controller(spec),
                                    backoff_limit=0,
                                    volumes=[_TMP_VOLUME])},
                  {"name": WORKER, "replicas": spec.islands,
                   "template": _job(spec, WORKER, _worker(spec),
                                    backoff_limit=spec.worker_restarts,
                                    volumes=_worker_volumes(spec),
                                    failure_policy=_WORKER_FAILURES)},
              ]}}


# A worker's exit codes (worker/join.py; worker/in_place.py restarts the
# rest in place), and pods taken away from a healthy worker, which do not
# count against the Job's backoffLimit.
_WORKER_FAILURES = {"rules": [
    {"action": "FailJob",
     "onExitCodes": {"containerName": WORKER, "operator": "In",
                     "values": [worker_main.EXIT_SETUP]}},
    {"action": "Ignore",
     "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
]}


def _job(spec: Spec, component: str, container: dict[str, Any],
         backoff_limit: int, volumes: list[dict[str, Any]],
         failure_policy: dict[str, Any] | None = None) -> dict[str, Any]:
  """A JobTemplateSpec of one pod (index 0: its DNS name ends in -0) that
  never restarts in place."""
  return {"spec": {
      "completions": 1, "parallelism": 1, "completionMode": "Indexed",
      "backoffLimit": backoff_limit,
      **({"podFailurePolicy": failure_policy} if failure_policy else {}),
      "template": {
          "metadata": {"labels": labels(spec, component)},
          "spec": {"restartPolicy": "Never",
                   # No FOO_SERVICE_HOST variables from other Services.
                   "enableServiceLinks": False,
                   # Pod Security Standards, "restricted" profile.
                   "securityContext": {
                       "runAsNonRoot": True,
                       "runAsUser": spec.run_as_user,
                       "runAsGroup": spec.run_as_user,
                       "fsGroup": spec.run_as_user,
                       "seccompProfile": {"type": "RuntimeDefault"}},
                   "containers": [container],
                   "volumes": volumes}}}}


_TMP_VOLUME = {"name": "tmp", "emptyDir": {}}
# What every container gets: no root, no privilege, no capability, its
# image read-only; it writes only to its volumes (HOME is /tmp).
_CONTAINER_SECURITY = {"allowPrivilegeEscalation": False,
                       "capabilities": {"drop": ["ALL"]},
                       "readOnlyRootFilesystem": True}


def _worker_volumes(spec: Spec) -> list[dict[str, Any]]:
  cache: dict[str, Any] = (
      {"persistentVolumeClaim": {"claimName": spec.cache_pvc}}
      if spec.cache_pvc else {"emptyDir": {}})
  volumes = [_TMP_VOLUME, dict(cache, name="cache")]
  if spec.gpus:  # NCCL's shared memory; the container's /dev/shm is 64 MiB
    volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
  if spec.storage_pvc:
    volumes.append({"name": "storage", "persistentVolumeClaim": {
        "claimName": spec.storage_pvc}})
  return volumes


def _mounts(*names_and_paths: tuple[str, str]) -> list[dict[str, Any]]:
  return [{"name": n, "mountPath": p} for n, p in names_and_paths]


def _token_env(spec: Spec) -> dict[str, Any]:
  return {"name": config.TOKEN, "valueFrom": {"secretKeyRef": {
      "name": spec.secret, "key": TOKEN_KEY}}}


def _field_env(name: str, path: str) -> dict[str, Any]:
  return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _resources(cpu: str, memory: str, gpus: int = 0) -> dict[str, Any]:
  amounts: dict[str, Any] = {"cpu": cpu, "memory": memory}
  if gpus:
    amounts["nvidia.com/gpu"] = str(gpus)
  return {"requests": dict(amounts), "limits": dict(amounts)}


def _controller(spec: Spec) -> dict[str, Any]:
  # Ready and live: it answers `jax-pathways status` (with the token from
  # the container's env).
  probe = {"exec": {"command": ["jax-pathways", "status", "--address",
                                f"grpc://127.0.0.1:{spec.port}"]},
           "timeoutSeconds": 10}
  return {
      "name": CONTROLLER, "image": spec.image,
      "command": ["jax-pathways", "controller",
                  "--islands", str(spec.islands),
                  "--listen", f"{ALL_ADDRESSES}:{spec.port}",
                  "--worker-listen", f"{ALL_ADDRESSES}:{spec.worker_port}",
                  # Workers are told this address: the pod's, not 0.0.0.0.
                  "--coordinator-listen",
                  f"$({POD_IP}):{spec.coordinator_port}",
                  *([] if spec.max_program_seconds is None else
                    ["--max-program-seconds", f"{spec.max_program_seconds:g}"])],
      "env": [_token_env(spec), _field_env(POD_IP, "status.podIP"),
              {"name": "HOME", "value": TMP}],
      "securityContext": _CONTAINER_SECURITY,
      "volumeMounts": _mounts(("tmp", TMP)),
      "ports": [{"name": "client", "containerPort": spec.port},
                {"name": "workers", "containerPort": spec.worker_port},
                {"name": "coordination",
                 "containerPort": spec.coordinator_port}],
      "readinessProbe": dict(probe, periodSeconds=5),
      # Lenient: killing the controller restarts the whole cluster.
      "livenessProbe": dict(probe, periodSeconds=10, failureThreshold=6),
      "resources": _resources(spec.controller_cpu, spec.controller_memory),
  }


def _worker(spec: Spec) -> dict[str, Any]:
  return {
      "name": WORKER, "image": spec.image,
      "command": ["jax-pathways", "worker", "--restart-in-place",
                  "--controller", spec.controller_address,
                  "--island", f"$({JOB_INDEX})",
                  "--devices", str(spec.devices_per_island),
                  # GPUs through JAX's CUDA plugin (the image's
                  # jax_pathways[cuda12]); else emulated CPU devices, also
                  # on a node that has GPUs.
                  "--platform", "cuda" if spec.gpus else "cpu",
                  # Other workers are told this address: the pod's.
                  "--data-listen", f"$({POD_IP}):{spec.data_port}",
                  # A worker restarted in its pod loads what it compiled.
                  "--compilation-cache-dir", CACHE_DIR,
                  *(("--storage-root", spec.worker_storage_root)
                    if spec.worker_storage_root else ()),
                  *(("--colocated-python",) if spec.colocated_python
                    else ())],
      "env": [_token_env(spec), _field_env(POD_IP, "status.podIP"),
              _field_env(JOB_INDEX, f"metadata.labels['{JOB_INDEX_LABEL}']"),
              {"name": "HOME", "value": TMP}],
      "securityContext": _CONTAINER_SECURITY,
      "volumeMounts": _mounts(("tmp", TMP), ("cache", CACHE_DIR),
                              *((("dshm", "/dev/shm"),) if spec.gpus
                                else ()),
                              *((("storage", STORAGE_DIR),) if spec.storage_pvc
                                else ())),
      "ports": [{"name": "data", "containerPort": spec.data_port}],
      "resources": _resources(spec.cpu, spec.memory, spec.gpus),
  }
