"""`jax-pathways k8s`: every object the Kubernetes API would accept, and the
wiring between them (names, ports, env, commands) consistent.

Core objects go through the official client's models (kubernetes==37.0.2):
deserialized (the models check types and required fields) and serialized
back unchanged, so a misspelt, mistyped or missing field fails. The
JobSet's own fields are checked against JOBSET_SCHEMA, its Job templates as
V1JobTemplateSpec. Commands are expanded as kubelet does ($(VAR) from the
container's env) and parsed with cli.py's own parser, so a renamed flag
fails here.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

import kubernetes  # the test extra: its models of the API
import pytest
import yaml

from jax_pathways import admin
from jax_pathways import cli
from jax_pathways import config
from jax_pathways.cluster import addresses
from jax_pathways.deploy import k8s
from jax_pathways.worker import join as worker_main

import processes  # tests/conftest.py puts tests/ on sys.path


POD_IP = "10.8.0.7"
TOKEN = "0123456789abcdef0123456789abcdef"

# jobset.x-k8s.io/v1alpha2 JobSet, from the API's Go types
# (api/jobset/v1alpha2/jobset_types.go, JobSet v0.10): a dict is an object
# with these optional fields, [t] a list of t, a tuple an enum, a string a
# model of the kubernetes client. Required fields are in JOBSET_REQUIRED.
JOBSET_SCHEMA: dict[str, Any] = {
    "apiVersion": str, "kind": str, "metadata": "V1ObjectMeta",
    "spec": {
        "replicatedJobs": [{
            "name": str, "groupName": str, "template": "V1JobTemplateSpec",
            "replicas": int,
            "dependsOn": [{"name": str, "status": ("Ready", "Complete")}],
        }],
        "network": {"enableDNSHostnames": bool, "subdomain": str,
                    "publishNotReadyAddresses": bool},
        "successPolicy": {"operator": ("All", "Any"),
                          "targetReplicatedJobs": [str]},
        "failurePolicy": {
            "maxRestarts": int,
            "restartStrategy": ("Recreate", "BlockingRecreate",
                                "InPlaceRestart"),
            "rules": [{
                "name": str,
                "action": ("FailJobSet", "RestartJobSet",
                           "RestartJobSetAndIgnoreMaxRestarts", "RestartJob",
                           "RestartJobAndIgnoreMaxRestarts"),
                "onJobFailureReasons": [str],
                "onJobFailureMessagePatterns": [str],
                "targetReplicatedJobs": [str]}]},
        "startupPolicy": {"startupPolicyOrder": ("AnyOrder", "InOrder")},
        "suspend": bool,
        "coordinator": {"replicatedJob": str, "jobIndex": int,
                        "podIndex": int},
        "managedBy": str,
        "ttlSecondsAfterFinished": int,
    },
}
JOBSET_REQUIRED = {"": {"apiVersion", "kind", "metadata", "spec"},
                   "spec": {"replicatedJobs"},
                   "spec.replicatedJobs[]": {"name", "template"},
                   "spec.successPolicy": {"operator"},
                   "spec.startupPolicy": {"startupPolicyOrder"}}
CORE_MODELS = {"Secret": "V1Secret", "Service": "V1Service",
               "NetworkPolicy": "V1NetworkPolicy"}

SPECS = [
    k8s.Spec(image="registry.example.com/jax-pathways:0.1.0"),
    k8s.Spec(image="img:1", name="train", namespace="ml", islands=8,
             devices_per_island=8, cpu="15500m", memory="60Gi", gpus=8,
             controller_cpu="4", controller_memory="16Gi", port=9000,
             worker_restarts=3, max_restarts=0),
    k8s.Spec(image="img:1", islands=1, token_secret="cluster-token"),
]


def _model(data: Any, model: str, where: str) -> None:
  """`data` as the client's `model` (which checks types and required
  fields), serialized back to exactly `data` (no field dropped)."""
  api = kubernetes.client.ApiClient()
  # pylint: disable-next=protected-access
  obj = api._ApiClient__deserialize(data, model)
  back = api.sanitize_for_serialization(obj)
  assert back == data, (f"{where}: {model} does not keep what was rendered "
                        f"(unknown or mistyped field):\n{data}\n{back}")


def _check(value: Any, schema: Any, where: str) -> None:
  if isinstance(schema, str):
    _model(value, schema, where)
  elif isinstance(schema, dict):
    assert isinstance(value, dict), where
    unknown = set(value) - set(schema)
    assert not unknown, f"{where}: no such fields {unknown}"
    key = re.sub(r"\[\d+\]", "[]", where.removeprefix("."))
    missing = JOBSET_REQUIRED.get(key, set()) - set(value)
    assert not missing, f"{where}: missing {missing}"
    for name, item in value.items():
      _check(item, schema[name], f"{where}.{name}")
  elif isinstance(schema, list):
    assert isinstance(value, list), where
    for i, item in enumerate(value):
      _check(item, schema[0], f"{where}[{i}]")
  elif isinstance(schema, tuple):
    assert value in schema, f"{where}: {value!r} not in {schema}"
  else:  # bool is an int in Python, not in the API
    assert type(value) is schema, f"{where}: {value!r} is not {schema}"


def _by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
  kinds = [o["kind"] for o in objects]
  assert len(set(kinds)) == len(kinds), kinds
  return {o["kind"]: o for o in objects}


def _replicated(jobset: dict[str, Any]) -> dict[str, dict[str, Any]]:
  return {r["name"]: r for r in jobset["spec"]["replicatedJobs"]}


def _pod(replicated_job: dict[str, Any]) -> dict[str, Any]:
  return replicated_job["template"]["spec"]["template"]


def _env_value(env: dict[str, Any], secret: dict[str, Any] | None,
               job_index: int, pod_ip: str) -> str:
  """What kubelet would set `env` to in the pod of Job `job_index`."""
  if "value" in env:
    return env["value"]
  source = env["valueFrom"]
  if "secretKeyRef" in source:
    ref = source["secretKeyRef"]
    if secret is None:
      return TOKEN  # an existing Secret the user made
    assert ref["name"] == secret["metadata"]["name"], ref
    return secret["stringData"][ref["key"]]
  path = source["fieldRef"]["fieldPath"]
  if path == "status.podIP":
    return pod_ip
  assert path == f"metadata.labels['{k8s.JOB_INDEX_LABEL}']", path
  return str(job_index)


def _command(container: dict[str, Any], secret: dict[str, Any] | None,
             job_index: int = 0, argv: list[str] | None = None,
             pod_ip: str = POD_IP) -> list[str]:
  """`argv` (default: the container's command) with $(VAR) expanded from
  the container's env, as kubelet does; every reference must be defined
  (kubelet would leave an undefined one as it is)."""
  env = {e["name"]: _env_value(e, secret, job_index, pod_ip)
         for e in container["env"]}

  def expand(match: re.Match[str]) -> str:
    assert match.group(1) in env, (
        f"$({match.group(1)}) is not in the container's env {sorted(env)}")
    return env[match.group(1)]
  argv = container["command"] if argv is None else argv
  return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", expand, a) for a in argv]


def _parse(argv: list[str]) -> Any:
  """argv as `jax-pathways` parses it."""
  scripts = {e.name: e.value for e in
             importlib.metadata.entry_points(group="console_scripts")}
  assert scripts.get(argv[0]) == "jax_pathways.cli:main", argv[0]
  return cli.make_parser().parse_args(argv[1:])


def _host_port(address: str) -> tuple[str, int]:
  host, _, port = address.rpartition(":")
  return host, int(port)


@pytest.mark.parametrize("spec", SPECS, ids=["defaults", "gpus", "secret"])
def test_every_object_fits_the_api_schema(spec):
  objects = k8s.manifests(spec, TOKEN)
  # Through YAML, as kubectl reads them.
  assert list(yaml.safe_load_all(k8s.to_yaml(objects))) == objects
  kinds = _by_kind(objects)
  assert set(kinds) == {"Service", "NetworkPolicy", "JobSet"} | (
      set() if spec.token_secret else {"Secret"})
  for kind, model in CORE_MODELS.items():
    if kind in kinds:
      _model(kinds[kind], model, kind)
  _check(kinds["JobSet"], JOBSET_SCHEMA, "")
  assert kinds["JobSet"]["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
  for obj in objects:
    assert obj["apiVersion"] and obj["metadata"]["name"]
    assert obj["metadata"].get("namespace") == spec.namespace


@pytest.mark.parametrize("spec", SPECS, ids=["defaults", "gpus", "secret"])
def test_jobset_rules(spec):
  """What JobSet's and Job's admission would refuse, and the restart
  policy the cluster relies on."""
  jobset = _by_kind(k8s.manifests(spec, TOKEN))["JobSet"]
  jobs = _replicated(jobset)
  assert list(jobs) == [k8s.CONTROLLER, k8s.WORKER]  # InOrder: controller first
  assert jobset["spec"]["startupPolicy"]["startupPolicyOrder"] == "InOrder"
  for target in jobset["spec"]["successPolicy"]["targetReplicatedJobs"]:
    assert target in jobs
  subdomain = jobset["spec"]["network"].get("subdomain",
                                            jobset["metadata"]["name"])
  assert jobset["spec"]["network"]["enableDNSHostnames"] is True
  for name, job in jobs.items():
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name)
    job_spec = job["template"]["spec"]
    # One pod per Job, index 0: the hostnames workers are given.
    assert (job_spec["completions"], job_spec["parallelism"],
            job_spec["completionMode"]) == (1, 1, "Indexed")
    # JobSet's webhook: pod names (hostname, '-', 5 random characters) and
    # the subdomain (its Service's name) are DNS-1035 labels.
    longest = (f"{jobset['metadata']['name']}-{name}-{job['replicas'] - 1}"
               "-0-abcde")
    for label in (longest, subdomain):
      assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", label), label
      assert len(label) <= 63, label
  controller, worker = jobs[k8s.CONTROLLER], jobs[k8s.WORKER]
  assert controller["replicas"] == 1
  assert worker["replicas"] == spec.islands  # one Job per island
  # No pod restarts in place: the controller's failure recreates the
  # JobSet; a worker restarts inside its pod (`--restart-in-place`), and a
  # pod failure policy (which needs restartPolicy Never) fails the JobSet
  # when it cannot start on its host (exit 2), ignores evictions and counts
  # the rest (incidents given up on in place) against backoffLimit.
  assert _pod(controller)["spec"]["restartPolicy"] == "Never"
  assert controller["template"]["spec"]["backoffLimit"] == 0
  assert "podFailurePolicy" not in controller["template"]["spec"]
  assert _pod(worker)["spec"]["restartPolicy"] == "Never"
  [container] = _pod(worker)["spec"]["containers"]
  assert "--restart-in-place" in container["command"]
  worker_job = worker["template"]["spec"]
  assert worker_job["backoffLimit"] == spec.worker_restarts
  cannot_start, evicted = worker_job["podFailurePolicy"]["rules"]
  assert cannot_start == {
      "action": "FailJob", "onExitCodes": {
          "containerName": container["name"], "operator": "In",
          "values": [worker_main.EXIT_SETUP]}}
  assert evicted == {"action": "Ignore", "onPodConditions": [
      {"type": "DisruptionTarget", "status": "True"}]}
  policy = jobset["spec"]["failurePolicy"]
  assert policy["maxRestarts"] == spec.max_restarts
  assert policy["rules"] == [{
      "name": "worker-cannot-start", "action": "FailJobSet",
      "onJobFailureReasons": ["PodFailurePolicy"],
      "targetReplicatedJobs": [k8s.WORKER]}]


@pytest.mark.parametrize("spec", SPECS, ids=["defaults", "gpus", "secret"])
def test_wiring(spec):
  objects = k8s.manifests(spec, TOKEN)
  kinds = _by_kind(objects)
  secret = kinds.get("Secret")
  jobset, service, policy = (kinds["JobSet"], kinds["Service"],
                             kinds["NetworkPolicy"])
  jobs = _replicated(jobset)
  controller_pod = _pod(jobs[k8s.CONTROLLER])
  worker_pod = _pod(jobs[k8s.WORKER])
  [controller] = controller_pod["spec"]["containers"]
  [worker] = worker_pod["spec"]["containers"]
  container_ports = {p["name"]: p["containerPort"]
                     for p in controller["ports"]}

  # The controller, as its command line says.
  c = _parse(_command(controller, secret))
  assert c.command == "controller"
  assert c.islands == jobs[k8s.WORKER]["replicas"] == spec.islands
  listen_host, client_port = _host_port(c.listen)
  _, worker_port = _host_port(c.worker_listen)
  coordinator_host, coordinator_port = _host_port(c.coordinator_listen)
  # Reachable from other pods; off loopback, so the token is required.
  assert listen_host == "0.0.0.0" and not addresses.is_loopback(c.listen)
  assert coordinator_host == POD_IP  # workers are told this address
  assert (container_ports["client"], container_ports["workers"],
          container_ports["coordination"]) == (
              client_port, worker_port, coordinator_port)

  # Clients: the Service selects the controller's pod, not the workers'.
  labels = controller_pod["metadata"]["labels"]
  selector = service["spec"]["selector"]
  assert selector.items() <= labels.items()
  assert not selector.items() <= worker_pod["metadata"]["labels"].items()
  [port] = service["spec"]["ports"]
  assert port["port"] == client_port == spec.port
  target = port["targetPort"]
  assert (container_ports[target] if isinstance(target, str)
          else target) == client_port
  # JobSet names its headless Service after the subdomain.
  subdomain = jobset["spec"]["network"]["subdomain"]
  assert service["metadata"]["name"] != subdomain

  # The probes ask the controller's client port, with the container's token.
  for probe in ("readinessProbe", "livenessProbe"):
    s = _parse(_command(controller, secret,
                        argv=controller[probe]["exec"]["command"]))
    assert s.command == "status"
    assert s.address == f"grpc://127.0.0.1:{client_port}"

  # Workers: one per island, at the controller pod's DNS name.
  controller_host = f"{jobset['metadata']['name']}-{k8s.CONTROLLER}-0-0"
  islands = set()
  for index in range(jobs[k8s.WORKER]["replicas"]):
    w = _parse(_command(worker, secret, job_index=index))
    assert w.command == "worker"
    assert w.controller == f"{controller_host}.{subdomain}:{worker_port}"
    assert w.devices == spec.devices_per_island
    assert w.platform == ("cuda" if spec.gpus else "cpu")
    data_host, data_port = _host_port(w.data_listen)
    assert data_host == POD_IP  # other workers are told this address
    assert {"name": "data", "containerPort": data_port} in worker["ports"]
    islands.add(w.island)
  assert islands == set(range(spec.islands))

  # The token: in the Secret, in every process's env, on no command line.
  for container in (controller, worker):
    [ref] = [e["valueFrom"]["secretKeyRef"] for e in container["env"]
             if e["name"] == config.TOKEN]
    assert ref == {"name": spec.token_secret or secret["metadata"]["name"],
                   "key": k8s.TOKEN_KEY}
    assert not any(TOKEN in json.dumps(container[key]) for key in container
                   if key != "env")
  if secret is not None:
    assert secret["stringData"] == {k8s.TOKEN_KEY: TOKEN}

  # Pods of this cluster reach each other; others reach the client port.
  matched = policy["spec"]["podSelector"]["matchLabels"].items()
  assert matched <= labels.items()
  assert matched <= worker_pod["metadata"]["labels"].items()
  [peers] = [r for r in policy["spec"]["ingress"] if "from" in r]
  assert peers["from"] == [{"podSelector": {"matchLabels": dict(matched)}}]
  assert "ports" not in peers
  [clients] = [r for r in policy["spec"]["ingress"] if "from" not in r]
  assert clients["ports"] == [{"port": client_port, "protocol": "TCP"}]

  # Resources: valid quantities; GPUs where asked for.
  parse = kubernetes.utils.parse_quantity
  limits = worker["resources"]["limits"]
  assert parse(limits["cpu"]) == parse(spec.cpu)
  assert parse(limits["memory"]) == parse(spec.memory)
  assert parse(limits.get("nvidia.com/gpu", "0")) == spec.gpus
  assert worker["resources"]["requests"] == limits
  assert parse(controller["resources"]["limits"]["memory"]) == parse(
      spec.controller_memory)


def test_longest_name():
  assert k8s.Spec(image="img:1", name="x" * 42).name == "x" * 42


def test_rendering_again_keeps_the_token(tmp_path, monkeypatch, capsys):
  """Applying a second rendering must not rotate the Secret under running
  pods (a worker restarted in place would read a token its controller
  does not know): the CLI keeps one token per namespace and name."""
  monkeypatch.setenv("HOME", str(tmp_path))
  monkeypatch.delenv("JAX_PATHWAYS_TOKEN", raising=False)

  def token(*flags):
    assert cli.main(["k8s", "--image", "img:1", *flags]) == 0
    return _by_kind(list(yaml.safe_load_all(capsys.readouterr().out)))[
        "Secret"]["stringData"]["token"]

  first = token()
  assert len(first) == 32 and token() == first
  assert token("--name", "other") != first
  kept = tmp_path / ".jax_pathways" / "k8s" / "_.jax-pathways.token"
  assert stat.S_IMODE(os.stat(kept).st_mode) == 0o600
  monkeypatch.setenv("JAX_PATHWAYS_TOKEN", "given")
  assert token() == "given"


def _restricted_violations(pod: dict[str, Any]) -> list[str]:
  """The Pod Security Standards' "restricted" profile (v1.30), the checks
  that apply to these pods: what a namespace enforcing it would refuse."""
  out = []
  pod_ctx = pod.get("securityContext", {})
  for c in pod["containers"] + pod.get("initContainers", []):
    ctx = c.get("securityContext", {})
    where = f"container {c['name']}"
    if ctx.get("allowPrivilegeEscalation") is not False:
      out.append(f"{where}: allowPrivilegeEscalation must be false")
    if ctx.get("capabilities", {}).get("drop") != ["ALL"]:
      out.append(f"{where}: capabilities must drop ALL")
    if set(ctx.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
      out.append(f"{where}: only NET_BIND_SERVICE may be added")
    if not (ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")) is True):
      out.append(f"{where}: runAsNonRoot must be true")
    if ctx.get("runAsUser", pod_ctx.get("runAsUser")) == 0:
      out.append(f"{where}: runAsUser must not be 0")
    seccomp = ctx.get("seccompProfile", pod_ctx.get("seccompProfile", {}))
    if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
      out.append(f"{where}: seccompProfile must be RuntimeDefault")
    if ctx.get("privileged"):
      out.append(f"{where}: privileged")
    for port in c.get("ports", []):
      if port.get("hostPort"):
        out.append(f"{where}: hostPort")
  for volume in pod.get("volumes", []):
    kinds = set(volume) - {"name"}
    allowed = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
               "persistentVolumeClaim", "projected", "secret"}
    if not kinds <= allowed:
      out.append(f"volume {volume['name']}: {sorted(kinds - allowed)}")
  for key in ("hostNetwork", "hostPID", "hostIPC"):
    if pod.get(key):
      out.append(key)
  return out


@pytest.mark.parametrize("spec", SPECS + [
    k8s.Spec(image="img:1", gpus=8, cache_pvc="compiled")],
                         ids=["defaults", "gpus", "secret", "gpus_pvc"])
def test_pods_pass_the_restricted_profile(spec):
  for name, job in _replicated(_by_kind(k8s.manifests(spec, TOKEN))[
      "JobSet"]).items():
    pod = job["template"]["spec"]["template"]["spec"]
    assert not _restricted_violations(pod), (name, _restricted_violations(pod))
    # Read-only images: every container writes only to its volumes.
    for c in pod["containers"]:
      assert c["securityContext"]["readOnlyRootFilesystem"] is True
      mounts = {m["mountPath"] for m in c["volumeMounts"]}
      assert "/tmp" in mounts
      assert {"name": "HOME", "value": "/tmp"} in c["env"]


def test_workers_keep_compiled_programs_and_gpus_get_their_sizes():
  gpus = k8s.Spec(image="img:1", gpus=8)
  assert (gpus.devices_per_island, gpus.cpu, gpus.memory) == (
      8, str(8 * k8s.CPU_PER_GPU), f"{8 * k8s.MEMORY_GIB_PER_GPU}Gi")
  for spec, cache in ((gpus, {"emptyDir": {}}),
                      (k8s.Spec(image="img:1", cache_pvc="compiled"),
                       {"persistentVolumeClaim": {"claimName": "compiled"}})):
    pod = _replicated(_by_kind(k8s.manifests(spec, TOKEN))["JobSet"])[
        k8s.WORKER]["template"]["spec"]["template"]["spec"]
    [worker] = pod["containers"]
    argv = worker["command"]
    assert argv[argv.index("--compilation-cache-dir") + 1] == k8s.CACHE_DIR
    assert {"name": "cache", **cache} in pod["volumes"]
    assert {"name": "cache", "mountPath": k8s.CACHE_DIR} in (
        worker["volumeMounts"])
    shm = {"name": "dshm", "mountPath": "/dev/shm"}
    assert (shm in worker["volumeMounts"]) == bool(spec.gpus)


def test_workers_share_a_storage_root_when_given_one():
  def worker(spec):
    pod = _replicated(_by_kind(k8s.manifests(spec, TOKEN))["JobSet"])[
        k8s.WORKER]["template"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    argv = container["command"]
    root = (argv[argv.index("--storage-root") + 1]
            if "--storage-root" in argv else None)
    return pod, container, root

  pod, container, root = worker(k8s.Spec(image="img:1", storage_pvc="ckpts"))
  assert root == k8s.STORAGE_DIR
  assert {"name": "storage", "persistentVolumeClaim": {
      "claimName": "ckpts"}} in pod["volumes"]
  assert {"name": "storage", "mountPath": k8s.STORAGE_DIR} in (
      container["volumeMounts"])
  assert not _restricted_violations(pod)
  pod, container, root = worker(k8s.Spec(image="img:1",
                                         storage_root="gs://bucket/ckpts"))
  assert root == "gs://bucket/ckpts"
  assert "storage" not in {v["name"] for v in pod["volumes"]}
  assert worker(k8s.Spec(image="img:1"))[2] is None


def test_workers_run_colocated_python_only_when_told():
  def argv(spec):
    pod = _replicated(_by_kind(k8s.manifests(spec, TOKEN))["JobSet"])[
        k8s.WORKER]["template"]["spec"]["template"]["spec"]
    return pod["containers"][0]["command"]

  assert "--colocated-python" not in argv(k8s.Spec(image="img:1"))
  assert "--colocated-python" in argv(k8s.Spec(image="img:1",
                                               colocated_python=True))


@pytest.mark.parametrize("flags,message", [
    (["--storage-pvc", "Bad_Name"], "--storage-pvc='Bad_Name'"),
    (["--storage-root", "/local"], "must be a gs:// or s3:// prefix"),
    (["--storage-root", "gs://b/x", "--storage-pvc", "ckpts"],
     "not given with --storage-pvc"),
    (["--name", "Train"], "--name='Train'"),
    (["--name", "x" * 43], "'" + "x" * 43 + "-controller-0-0-abcde' within 63"),
    (["--islands", "0"], "--islands=0"),
    (["--memory", "8 GB"], "--memory='8 GB'"),
    (["--port", "65535"], "--port=65535"),
    (["--gpus", "-1"], "--gpus=-1"),
    (["--gpus", "8", "--devices-per-island", "4"],
     "--devices-per-island=4 with --gpus=8"),
    (["--run-as-user", "0"], "--run-as-user=0"),
    (["--max-program-seconds", "0"], "--max-program-seconds=0.0 must be > 0"),
])
def test_cli_refuses(flags, message, capsys):
  with pytest.raises(SystemExit) as e:
    cli.main(["k8s", "--image", "img:1", *flags])
  assert e.value.code == 2
  assert message in capsys.readouterr().err


def test_cli_prints_and_writes(tmp_path, capsys, monkeypatch):
  monkeypatch.setenv("JAX_PATHWAYS_TOKEN", TOKEN)
  assert cli.main(["k8s", "--image", "img:1", "--islands", "3"]) == 0
  printed = list(yaml.safe_load_all(capsys.readouterr().out))
  assert [o["kind"] for o in printed] == ["Secret", "Service",
                                           "NetworkPolicy", "JobSet"]
  assert _replicated(printed[-1])[k8s.WORKER]["replicas"] == 3

  out = tmp_path / "manifests"
  assert cli.main(["k8s", "--image", "img:1", "--out", str(out)]) == 0
  # Named in the order to apply them (kubectl applies a folder by name).
  written = sorted(os.listdir(out))
  assert written == ["00-secret.yaml", "01-service.yaml",
                     "02-networkpolicy.yaml", "03-jobset.yaml"]
  assert stat.S_IMODE(os.stat(out / "00-secret.yaml").st_mode) == 0o600
  assert stat.S_IMODE(os.stat(out / "03-jobset.yaml").st_mode) == 0o644
  [secret] = yaml.safe_load_all((out / "00-secret.yaml").read_text())
  assert secret["kind"] == "Secret"


CLIENT = textwrap.dedent("""
    import json, sys
    import jax_pathways
    jax_pathways.initialize(sys.argv[1], token=sys.argv[2])
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    devices = jax.devices()
    x = jax.device_put(np.arange(8.0),
                       NamedSharding(Mesh(np.array(devices), ("x",)), P("x")))
    total = jax.jit(lambda a: a.sum())(x)
    moved = jax.device_put(jax.device_put(np.arange(4.0), devices[3]),
                           devices[0])
    print(json.dumps({"total": float(total),
                      "moved": np.asarray(moved).tolist()}))
""")


def _free_ports(count: int) -> int:
  """A port p such that p..p+count-1 are free now."""
  for _ in range(100):
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      base = s.getsockname()[1]
    if base + count > 65535:
      continue
    try:
      for p in range(base, base + count):
        with socket.create_server(("127.0.0.1", p)):
          pass
      return base
    except OSError:
      continue
  raise AssertionError("no free ports")


@pytest.mark.integration
def test_rendered_commands_start_a_cluster():
  """The controller, workers and probe commands as rendered, run here: each
  pod's IP is an address of its own on loopback (127.0.0.2, ...), which
  jax_pathways takes for another host's, and the controller's DNS name
  resolves to the controller pod's."""
  spec = k8s.Spec(image="img:1", islands=2, devices_per_island=4,
                  port=_free_ports(4), max_program_seconds=90)
  kinds = _by_kind(k8s.manifests(spec))
  secret, jobs = kinds["Secret"], _replicated(kinds["JobSet"])
  token = secret["stringData"][k8s.TOKEN_KEY]
  [controller] = _pod(jobs[k8s.CONTROLLER])["spec"]["containers"]
  [worker] = _pod(jobs[k8s.WORKER])["spec"]["containers"]
  env = dict(os.environ, **{config.TOKEN: token})
  for key in ("JAX_PLATFORMS", "XLA_FLAGS", config.ADDRESS):
    env.pop(key, None)
  controller_ip = "127.0.0.2"
  dns_name = spec.controller_address.rpartition(":")[0]

  cache = tempfile.mkdtemp(prefix="jax_pathways_k8s_cache_")

  def start(argv: list[str], log: Any) -> subprocess.Popen:
    # The pod's volumes, here: the cache volume a folder of the test's.
    argv = [cache if a == k8s.CACHE_DIR else a.replace(dns_name,
                                                        controller_ip)
            for a in argv]
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "jax_pathways.cli", *argv[1:]], env=env,
        stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
        cwd=tempfile.gettempdir()))
    return procs[-1]

  procs: list[subprocess.Popen] = []
  logs = tempfile.TemporaryFile("w+")
  try:
    start(_command(controller, secret, pod_ip=controller_ip), logs)
    probe = _command(controller, secret, pod_ip=controller_ip,
                     argv=controller["readinessProbe"]["exec"]["command"])
    deadline = time.monotonic() + 60
    while subprocess.run([sys.executable, "-m", "jax_pathways.cli",
                          *probe[1:]], env=env, capture_output=True,
                         cwd=tempfile.gettempdir()).returncode != 0:
      assert time.monotonic() < deadline and procs[0].poll() is None, (
          "the controller never got ready")
      time.sleep(0.5)
    for index in range(spec.islands):
      start(_command(worker, secret, job_index=index,
                     pod_ip=f"127.0.0.{3 + index}"), logs)
    address = f"grpc://127.0.0.1:{spec.port}"
    while not admin.status(address, token)["complete"]:
      assert time.monotonic() < deadline, "the workers never joined"
      time.sleep(0.2)
    status = admin.status(address, token)
    assert [(i["island"], len(i["devices"]), i["alive"])
            for i in status["islands"]] == [(0, 4, True), (1, 4, True)]
    assert status["max_program_s"] == 90
    with pytest.raises(admin.AdminError):  # without the token: refused
      admin.status(address, None)
    # A client at the Service's port: a program spanning both islands
    # (the coordination service at the controller pod's IP, gloo at the
    # workers') and a move between islands (the workers' data ports).
    client_env = {k: v for k, v in env.items() if k != config.TOKEN}
    out = subprocess.run([sys.executable, "-c", CLIENT, address, token],
                         env=client_env, capture_output=True, text=True,
                         timeout=120, cwd=tempfile.gettempdir())
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.splitlines()[-1]) == {
        "total": 28.0, "moved": [0.0, 1.0, 2.0, 3.0]}
    # A worker killed in its pod: started again there (the pod's process
    # lives on), its island back as its next generation.
    pod, [before, _] = procs[1], status["islands"]
    os.kill(before["pid"], signal.SIGKILL)
    while True:
      after = admin.status(address, token)["islands"][0]
      if after["alive"] and after["pid"] != before["pid"]:
        break
      assert time.monotonic() < deadline + 120, after  # hang guard
      time.sleep(0.2)
    assert after["generation"] > before["generation"], after
    assert pod.poll() is None
  except AssertionError:
    logs.seek(0)
    raise AssertionError(logs.read()[-5000:]) from None
  finally:
    processes.stop(procs)
    shutil.rmtree(cache, ignore_errors=True)
