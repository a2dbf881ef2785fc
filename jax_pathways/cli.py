"""The `jax-pathways` command: controller, worker, status, cancel, connect,
k8s and ray.

    jax-pathways controller --islands 2 [--listen 127.0.0.1:8470] [--worker-listen 127.0.0.1:8471]
    jax-pathways worker --controller HOST:PORT [--island 0] [--devices 4] [--platform cpu] [--device-cores 0-3]
    jax-pathways status [--address grpc://HOST:PORT] [--json]
    jax-pathways cancel --client N [--address grpc://HOST:PORT]
    jax-pathways k8s --image IMAGE [--islands 2] [--out DIR]  (docs/deploy.md)
    jax-pathways ray start|stop [--name NAME] [--islands 2] ...  (docs/deploy.md)
    jax-pathways connect --controller HOST:PORT [--listen unix:PATH] [--token-file FILE]

The cluster token is read from JAX_PATHWAYS_TOKEN by all of them, else from
the file a controller keeps it in (JAX_PATHWAYS_TOKEN_FILE, by default
~/.jax_pathways/token, mode 0600): a controller (or `ray start`) started
without a token makes one there, unless --insecure (loopback only) asks for
none. `connect` serves JAX clients that cannot send the token
(pathwaysutils) on a private Unix socket and adds it to their sessions.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import sys
import threading
import time
from typing import Any, Sequence

from jax_pathways import config
from jax_pathways import logs
from jax_pathways.cluster import cores
from jax_pathways.cluster import tokens
from jax_pathways.deploy import k8s
from jax_pathways.status import StatusError


def _print_status(s: dict[str, Any]) -> None:
  alive = sum(1 for i in s["islands"] if i["alive"])
  print(f"jax_pathways {s['version']}  up {s['uptime_s']} s  "
        f"islands alive {alive}/{s['expected_islands']}  "
        f"max in flight {s['max_in_flight']}")
  g = s.get("global_client")
  if g:
    print(f"global client generation {g['generation']}: {g['state']}" +
          (f" ({g['error']})" if g["error"] else ""))
  print(f"{'island':>6}  {'devices':<12} {'alive':<5} {'queued':>6} "
        f"{'in flight':>9} {'done':>8}  {'memory MiB':>15}  worker")
  for i in s["islands"]:
    devs = i["devices"]
    span = f"{devs[0]}..{devs[-1]}" if devs else "-"
    cap = i.get("memory_capacity", 0)
    memory = (f"{i.get('memory_used', 0) / 2**20:.0f}/"
              f"{cap / 2**20:.0f}" if cap else "untracked")
    print(f"{i['island']:>6}  {span:<12} {str(i['alive']):<5} "
          f"{i['queued']:>6} {i['in_flight']:>9} {i['finished']:>8}  "
          f"{memory:>15}  "
          f"{i['worker']}" +
          ("  (reads uploads locally)" if i.get("reads_locally") else "") +
          (f"  {i['send_backlog_bytes'] / 2**20:.1f} MiB not yet read by the "
           "worker" if i.get("send_backlog_bytes") else "") +
          (f"  ERROR: {i['error']}" if i["error"] else ""))
    if i.get("last_lost_at"):
      when = time.strftime("%Y-%m-%d %H:%M:%S UTC",
                           time.gmtime(i["last_lost_at"]))
      print(f"{'':>8}restarts {i.get('restarts', 0)}, last lost {when}: "
            f"{i['last_lost']}" +
            ("" if i.get("global_client", True) else
             "; not in the islands' global client now (it is built anew "
             "at the next program spanning islands)"))
    run = i.get("running")
    if run:
      print(f"{'':>8}running program '{run['program']}' of client "
            f"{run['client']} for {run['seconds']} s")
    sup = i.get("supervisor")
    if sup:
      print(f"{'':>8}supervisor: {sup['restarts']} worker restart(s), "
            f"current pid {sup['pid']}" +
            (f"; GAVE UP: {sup['given_up']}" if sup["given_up"] else ""))
  print(f"clients: {len(s['clients'])}")
  for c in s["clients"]:
    devices = c["devices"]
    held = "not yet placed" if devices is None else f"devices {devices}"
    memory = ", ".join(f"island {i}: {b} B"
                       for i, b in sorted(c["array_bytes"].items())) or "0 B"
    print(f"  client {c['client']} ({c['peer']}): asked {c['asked']}, "
          f"holds {held}")
    print(f"    {c['arrays']} arrays ({memory}), "
          f"{c['executables']} executables, weight {c.get('weight', 1):g}, "
          f"{c.get('device_seconds', 0):.3f} device-seconds")
  print(f"live buffers {s['live_buffers']}, compiled programs "
        f"{s['compiled_programs']}, host buffer bytes {s['host_buffer_bytes']}")


def make_parser() -> argparse.ArgumentParser:
  """The command line of every verb (tests parse rendered manifests with it)."""
  top = argparse.ArgumentParser(prog="jax-pathways", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = top.add_subparsers(dest="command", required=True)

  c = sub.add_parser("controller", help="run a controller")
  c.add_argument("--islands", type=int, default=None,
                 help=f"island workers to wait for (default ${config.ISLANDS} "
                 f"or {config.DEFAULT_ISLANDS})")
  c.add_argument("--listen", default="127.0.0.1:0",
                 help="where clients connect: HOST:PORT (port 0: any) or "
                 "unix:/path; anything off loopback requires "
                 "JAX_PATHWAYS_TOKEN (default 127.0.0.1:0)")
  c.add_argument("--worker-listen", default="127.0.0.1:0",
                 help="where workers join (same forms; default 127.0.0.1:0)")
  c.add_argument("--coordinator-listen", default="127.0.0.1:0",
                 help="the coordination service of the islands' global "
                 "client, for programs that span islands (same forms)")
  c.add_argument("--max-in-flight", type=int, default=None,
                 help="launches in flight per island (default 16)")
  c.add_argument("--memory-wait", type=float, default=None,
                 help="seconds a launch may wait for device memory other "
                 "clients hold before it fails (default 60)")
  c.add_argument("--worker-timeout", type=float, default=None,
                 help="seconds of silence (workers send a heartbeat every "
                 "second) after which a worker is lost: its island's work "
                 "fails, programs spanning it fail everywhere (default "
                 f"${config.WORKER_TIMEOUT} or "
                 f"{config.DEFAULT_WORKER_TIMEOUT:g})")
  c.add_argument("--max-program-seconds", type=float, default=None,
                 help="seconds a program may hold its island; past them the "
                 "island is taken back: its worker is dropped (its "
                 "supervisor starts another) and the island's work and "
                 f"arrays fail with the reason (default ${config.MAX_PROGRAM_SECONDS} "
                 "or none)")
  c.add_argument("--reduction-order", choices=("rank", "ring"),
                 default="rank",
                 help="float sums of programs that span islands: 'rank' adds "
                 "in the order one host would (same bits; each such program "
                 "is compiled twice), 'ring' leaves them to gloo's ring "
                 "all-reduce (last bits differ) (default rank)")
  c.add_argument("--insecure", action="store_true",
                 help="accept clients and workers without a cluster token "
                 "(only where every address is loopback or a Unix socket); "
                 "by default a controller without JAX_PATHWAYS_TOKEN makes "
                 "a token and keeps it in $JAX_PATHWAYS_TOKEN_FILE "
                 "(~/.jax_pathways/token, mode 0600)")
  c.add_argument("--parent-pid", type=int, default=None,
                 help=argparse.SUPPRESS)

  w = sub.add_parser("worker", help="run an island worker")
  w.add_argument("--controller", required=True,
                 help="the controller's worker address (HOST:PORT or "
                 "unix:/path)")
  w.add_argument("--island", type=int, default=None,
                 help="island id to take (default: the next free one)")
  w.add_argument("--devices", type=int, default=None,
                 help="CPU devices this worker emulates (default "
                 f"${config.DEVICES_PER_ISLAND} or "
                 f"{config.DEFAULT_DEVICES_PER_ISLAND}); on another platform "
                 "the island has all the devices it shows, and --devices, "
                 "if given, must match")
  w.add_argument("--platform", default=None,
                 help="the PJRT platform of the island: cpu, cuda, rocm, tpu "
                 "or another JAX knows (default: the one JAX finds on this "
                 "host); all but cpu come from JAX's own plugin "
                 "(pip install 'jax_pathways[cuda12]' etc.)")
  w.add_argument("--data-listen", default="127.0.0.1:0",
                 help="where other workers send data (HOST:PORT or "
                 "unix:/path; default 127.0.0.1:0)")
  w.add_argument("--connect-timeout", type=float, default=60.0)
  w.add_argument("--controller-timeout", type=float,
                 default=config.DEFAULT_CONTROLLER_TIMEOUT,
                 help="seconds of silence (the controller sends a heartbeat "
                 "every second) after which the controller is lost (stopped, "
                 "wedged or cut off) and the worker exits; keep it above the "
                 "controller's --worker-timeout (default "
                 f"{config.DEFAULT_CONTROLLER_TIMEOUT:g})")
  w.add_argument("--device-memory", default=None,
                 help="device memory per device, e.g. 16G (default: what "
                 f"the device reports, or ${config.DEVICE_MEMORY}; CPU "
                 "devices report none: unlimited)")
  w.add_argument("--device-cores", default=None,
                 help="CPU cores the devices compute on, e.g. 0-3 or 0,2 "
                 "(Linux; default: any); the worker's other threads run "
                 "anywhere")
  w.add_argument("--compilation-cache-dir", default=None,
                 help="keep compiled programs in this directory (this "
                 "user's alone), for the worker that takes this one's place "
                 "and the next run (default: none)")
  w.add_argument("--storage-root", default=None,
                 help="the directory (or gs:// or s3:// prefix) under which "
                 "clients' persistence requests save and restore arrays "
                 f"(default ${config.STORAGE_ROOT}; unset: they are "
                 "refused); see docs/storage.md")
  w.add_argument("--colocated-python", action="store_true",
                 help="let clients run jax.experimental.colocated_python "
                 "functions on this host, each client in a process of its "
                 "own (their code runs as this worker's user; see "
                 "docs/colocated_python.md)")
  w.add_argument("--simulate", type=int, default=None, metavar="N",
                 help="join as N simulated islands of --devices CPU devices "
                 "each, which acknowledge ops without computing (to measure "
                 "the controller at scale; see jax_pathways/worker/"
                 "simulated.py)")
  w.add_argument("--restart-in-place", action="store_true",
                 help="run the worker as a child and start it again here "
                 "when it exits with a code a restart can fix, with the "
                 "embedded cluster's limits per incident; exit 2 at once "
                 "when it cannot start on this host (a Kubernetes pod's "
                 "command: worker/in_place.py)")

  s = sub.add_parser("status", help="show a controller's islands and queues")
  s.add_argument("--address", default=None,
                 help=f"grpc://HOST:PORT (default ${config.ADDRESS}, else "
                 "every cluster of this host: embedded, CLI, Ray actors "
                 "here, and those `connect` forwards to)")
  s.add_argument("--json", action="store_true", help="print raw JSON")

  x = sub.add_parser("cancel", help="end a client: its session, arrays and "
                     "programs; islands running its programs are taken back "
                     "(their workers restarted: every array on them is lost)")
  x.add_argument("--client", type=int, required=True,
                 help="the client's number, as `status` lists it")
  x.add_argument("--address", default=None,
                 help=f"grpc://HOST:PORT (default ${config.ADDRESS})")

  f = sub.add_parser("connect", help="a local socket that adds the cluster "
                     "token for clients that cannot send it (pathwaysutils)")
  f.add_argument("--controller", required=True,
                 help="the controller's client address (HOST:PORT)")
  f.add_argument("--listen", default=None,
                 help="unix:/path of the socket, in a folder only you may "
                 "enter (mode 0700; default: a fresh one under "
                 "$XDG_RUNTIME_DIR or the temp folder)")
  f.add_argument("--token-file", default=None,
                 help="a file (mode 0600) holding the token (default "
                 "JAX_PATHWAYS_TOKEN, else the controller's token file)")

  _add_k8s(sub.add_parser(
      "k8s", help="print the Kubernetes manifests of a cluster (a JobSet, "
      "its Service, Secret and NetworkPolicy)", description=k8s.__doc__,
      formatter_class=argparse.RawDescriptionHelpFormatter))
  _add_ray(sub.add_parser(
      "ray", help="start or stop a cluster as actors on a running Ray "
      "cluster (pip install 'jax_pathways[ray]')"))
  return top


def _add_ray(r: argparse.ArgumentParser) -> None:
  verbs = r.add_subparsers(dest="ray_command", required=True)
  start = verbs.add_parser(
      "start", help="start the controller and one worker per island, one "
      "island per node; print the client address")
  stop = verbs.add_parser("stop", help="kill the actors, remove the "
                          "placement group")
  for v in (start, stop):
    v.add_argument("--ray-address", default=None,
                   help="the Ray cluster (default: $RAY_ADDRESS, or the one "
                   "this node belongs to)")
    v.add_argument("--name", default="jax-pathways",
                   help="the controller actor's name (default %(default)s)")
  start.add_argument("--islands", type=int, default=config.DEFAULT_ISLANDS,
                     help="island workers, one node each (default "
                     "%(default)s)")
  start.add_argument("--devices-per-island", type=int,
                     default=config.DEFAULT_DEVICES_PER_ISLAND,
                     help="(default %(default)s)")
  start.add_argument("--cpus", type=float, default=1,
                     help="CPUs each island reserves (default %(default)s)")
  start.add_argument("--gpus", type=float, default=0,
                     help="GPUs each island reserves (default %(default)s)")
  start.add_argument("--resource", action="append", default=[],
                     metavar="NAME=AMOUNT",
                     help="a custom resource each island reserves "
                     "(repeatable)")
  start.add_argument("--controller-cpus", type=float, default=1,
                     help="(default %(default)s)")
  start.add_argument("--port", type=int, default=0,
                     help="the client port on the controller's node "
                     "(default: any free one)")
  start.add_argument("--max-restarts", type=int, default=-1,
                     help="Ray's restarts of each worker actor (-1: no "
                     "limit; default %(default)s)")
  start.add_argument("--worker-timeout", type=float, default=None,
                     help="the controller's --worker-timeout")
  start.add_argument("--max-program-seconds", type=float, default=None,
                     help="the controller's --max-program-seconds (default "
                     f"${config.MAX_PROGRAM_SECONDS} or none)")
  start.add_argument("--storage-root", default=None,
                     help="the workers' storage root: a directory every "
                     "node mounts at the same path (a shared volume), or "
                     "a gs:// or s3:// prefix (docs/storage.md; default "
                     f"${config.STORAGE_ROOT}, else none)")
  start.add_argument("--colocated-python", action="store_true",
                     help="let clients run colocated_python functions on "
                     "the workers' nodes (docs/colocated_python.md)")
  start.add_argument("--side-by-side", action="store_true",
                     help="let islands share a node (a one-node Ray "
                     "cluster); default: one island per node, and too few "
                     "nodes is an error at once")


def _check_worker_timeout(parser: argparse.ArgumentParser,
                          seconds: float | None) -> None:
  if seconds is not None and not seconds >= 2:
    parser.error(f"--worker-timeout={seconds} must be >= 2 seconds "
                 "(workers send a heartbeat every second)")


def _max_program_seconds(parser: argparse.ArgumentParser,
                         args: argparse.Namespace,
                         cfg: config.Config) -> float | None:
  """--max-program-seconds, checked, else the environment's."""
  try:
    seconds = config.max_program_seconds(args.max_program_seconds,
                                         "--max-program-seconds")
  except ValueError as e:
    parser.error(str(e))
  return seconds or cfg.max_program_seconds


def _ray(parser: argparse.ArgumentParser, args: argparse.Namespace,
         cfg: config.Config) -> int:
  try:
    from jax_pathways.deploy import ray_actors as on_ray  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    print(f"jax-pathways ray: {e}; pip install 'jax_pathways[ray]'",
          file=sys.stderr)
    return 2
  if args.ray_command == "stop":
    if not on_ray.stop(args.name, args.ray_address):
      print(f"jax-pathways ray: no cluster named {args.name!r}",
            file=sys.stderr)
      return 1
    print(f"jax-pathways ray: stopped {args.name!r} (its controller and "
          "worker actors, and its placement group)")
    return 0
  _check_worker_timeout(parser, args.worker_timeout)
  max_program_s = _max_program_seconds(parser, args, cfg)
  resources = {"CPU": args.cpus, "GPU": args.gpus}
  for item in args.resource:
    key, _, amount = item.partition("=")
    try:
      resources[key] = float(amount)
    except ValueError:
      parser.error(f"--resource {item!r}: expected NAME=AMOUNT")
  # As a controller's: clients on this host find it in the token file.
  token = cfg.token or tokens.load_or_create(cfg.token_file)
  try:
    cluster = on_ray.start(
        args.islands, args.devices_per_island,
        {k: v for k, v in resources.items() if v}, name=args.name,
        controller_resources={"CPU": args.controller_cpus}, port=args.port,
        token=token, max_restarts=args.max_restarts,
        worker_timeout_s=args.worker_timeout, max_program_s=max_program_s,
        ray_address=args.ray_address,
        timeout_s=cfg.start_timeout, side_by_side=args.side_by_side,
        storage_root=args.storage_root or cfg.storage_root,
        colocated_python=args.colocated_python)
  except (ValueError, on_ray.ClusterError) as e:
    print(f"jax-pathways ray: {e}", file=sys.stderr)
    return 1
  print(json.dumps({"name": cluster.name, "address": cluster.address,
                    "islands": cluster.islands}), flush=True)
  print(f"token: {'$' + config.TOKEN if cfg.token else cfg.token_file}",
        file=sys.stderr)
  return 0


def _add_k8s(k: argparse.ArgumentParser) -> None:
  default = {f.name: f.default for f in dataclasses.fields(k8s.Spec)}
  k.add_argument("--image", required=True,
                 help="an image with jax_pathways installed (`jax-pathways` "
                 "on its PATH; docs/deploy.md)")
  k.add_argument("--name", default=default["name"],
                 help="the JobSet's name; the other objects' names start "
                 "with it (default %(default)s)")
  k.add_argument("--namespace", default=None,
                 help="default: kubectl's current namespace")
  k.add_argument("--islands", type=int, default=default["islands"],
                 help="island workers, one pod each (default %(default)s)")
  k.add_argument("--devices-per-island", type=int, default=None,
                 help="the worker's --devices (default: --gpus if given, "
                 f"else {config.DEFAULT_DEVICES_PER_ISLAND})")
  k.add_argument("--cpu", default=None,
                 help="CPU per worker, request and limit (default 4; with "
                 f"--gpus N, {k8s.CPU_PER_GPU} per GPU)")
  k.add_argument("--memory", default=None,
                 help="memory per worker (default 8Gi; with --gpus N, "
                 f"{k8s.MEMORY_GIB_PER_GPU}Gi per GPU, and /dev/shm in "
                 "memory)")
  k.add_argument("--gpus", type=int, default=default["gpus"],
                 help="nvidia.com/gpu per worker (default %(default)s); "
                 "more than 0: the workers are CUDA islands (--platform "
                 "cuda) of that many devices")
  k.add_argument("--controller-cpu", default=default["controller_cpu"],
                 help="(default %(default)s)")
  k.add_argument("--controller-memory", default=default["controller_memory"],
                 help="(default %(default)s)")
  k.add_argument("--port", type=int, default=default["port"],
                 help="the client port; workers join at PORT+1, the "
                 "coordination service listens at PORT+2, workers' data at "
                 "PORT+3 (default %(default)s)")
  k.add_argument("--token-secret", default=None,
                 help="an existing Secret holding the cluster token under "
                 f"the key '{k8s.TOKEN_KEY}' (default: render a Secret with "
                 "$JAX_PATHWAYS_TOKEN, else the token kept for this "
                 "cluster's name in ~/.jax_pathways/k8s/, made once: "
                 "rendering again never rotates it)")
  k.add_argument("--run-as-user", type=int, default=default["run_as_user"],
                 help="the pods' uid and gid (default %(default)s; never "
                 "root: the restricted Pod Security Standard)")
  k.add_argument("--cache-pvc", default=None,
                 help="a PersistentVolumeClaim for the workers' "
                 "compilation cache (default: an emptyDir per pod, kept "
                 "across restarts in place)")
  k.add_argument("--storage-pvc", default=None,
                 help="a ReadWriteMany PersistentVolumeClaim every worker "
                 f"mounts at {k8s.STORAGE_DIR}, their storage root: where "
                 "checkpoints are saved and restored (docs/storage.md; "
                 "default: none, persistence requests refused)")
  k.add_argument("--storage-root", default=None,
                 help="instead of --storage-pvc: a gs:// or s3:// prefix, "
                 "the workers' storage root")
  k.add_argument("--colocated-python", action="store_true",
                 help="let clients run colocated_python functions on the "
                 "workers' pods (their code, as the pods' user; "
                 "docs/colocated_python.md)")
  k.add_argument("--max-program-seconds", type=float, default=None,
                 help="the controller's --max-program-seconds: seconds a "
                 "program may hold its island (default: none)")
  k.add_argument("--worker-restarts", type=int,
                 default=default["worker_restarts"],
                 help="restarts of one island's worker before the whole "
                 "cluster restarts (default %(default)s)")
  k.add_argument("--max-restarts", type=int, default=default["max_restarts"],
                 help="restarts of the whole cluster (JobSet failurePolicy; "
                 "default %(default)s)")
  k.add_argument("--out", default=None,
                 help="write one file per object into this folder, named "
                 "in the order to apply them (the Secret's mode 0600), "
                 "instead of printing them")


def _k8s(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
  fields = {f.name for f in dataclasses.fields(k8s.Spec)}
  try:
    spec = k8s.Spec(**{k: v for k, v in vars(args).items() if k in fields})
  except ValueError as e:
    parser.error(str(e))
  objects = k8s.manifests(spec, None if spec.token_secret else (
      os.environ.get(config.TOKEN) or tokens.load_or_create(
          k8s.token_path(spec))))
  if args.out:
    for path in k8s.write(objects, args.out):
      print(path)
  else:
    sys.stdout.write(k8s.to_yaml(objects))
  return 0


def main(argv: Sequence[str] | None = None) -> int:
  try:
    return _main(argv)
  except BrokenPipeError:
    # The reader went (`jax-pathways status --json | head`): what it did
    # not read is not an error; Python's own flush at exit would say so.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _main(argv: Sequence[str] | None) -> int:
  parser = make_parser()
  args = parser.parse_args(argv)
  if args.command == "k8s":
    return _k8s(parser, args)
  try:
    cfg = config.from_env()
  except Exception as e:  # pylint: disable=broad-except
    print(f"jax-pathways: {e}", file=sys.stderr)
    return 2

  if args.command == "ray":
    return _ray(parser, args, cfg)
  if args.command in ("controller", "worker", "connect"):
    logs.setup_logging(cfg.verbosity)
  if args.command == "controller":
    from jax_pathways.controller import serve as controller_main  # pylint: disable=import-outside-toplevel
    max_in_flight = args.max_in_flight or cfg.max_in_flight
    if not 1 <= max_in_flight <= config.MAX_SAFE_IN_FLIGHT:
      parser.error(f"--max-in-flight={max_in_flight} must be in "
                   f"1..{config.MAX_SAFE_IN_FLIGHT} (XLA:CPU hangs at 64)")
    if args.memory_wait is not None and not args.memory_wait > 0:
      parser.error(f"--memory-wait={args.memory_wait} must be > 0 seconds")
    _check_worker_timeout(parser, args.worker_timeout)
    worker_timeout = (args.worker_timeout if args.worker_timeout is not None
                      else cfg.worker_timeout)
    max_program_s = _max_program_seconds(parser, args, cfg)
    token = controller_main.token(cfg, args.insecure, args.listen,
                                  args.worker_listen, args.coordinator_listen)
    return controller_main.run(args.islands or cfg.islands, args.listen,
                               args.worker_listen, args.coordinator_listen,
                               token, max_in_flight, args.parent_pid,
                               args.memory_wait, args.reduction_order,
                               worker_timeout, max_program_s)
  if args.command == "worker":
    from jax_pathways.worker import join as worker_main  # pylint: disable=import-outside-toplevel
    memory = (config.parse_bytes(args.device_memory, "--device-memory")
              if args.device_memory else cfg.device_memory)
    try:
      device_cores = (cores.parse(args.device_cores)
                      if args.device_cores else None)
    except ValueError as e:
      parser.error(f"--device-cores: {e}")
    if not args.controller_timeout >= 2:
      parser.error(f"--controller-timeout={args.controller_timeout} must be "
                   ">= 2 seconds (the controller sends a heartbeat every "
                   "second)")
    if args.platform is not None:
      try:
        config.platform_name(args.platform, "--platform")
      except StatusError as e:
        parser.error(e.status.message)
    if args.restart_in_place:
      from jax_pathways.worker import in_place  # pylint: disable=import-outside-toplevel
      given = list(sys.argv[1:] if argv is None else argv)
      return in_place.run([a for a in given[1:] if a != in_place.FLAG])
    if args.simulate is not None:
      if not args.simulate >= 1:
        parser.error(f"--simulate={args.simulate} must be >= 1")
      if args.island is not None or args.platform not in (None, "cpu"):
        parser.error("--simulate takes neither --island nor a --platform "
                     "other than cpu")
      from jax_pathways.worker import simulated  # pylint: disable=import-outside-toplevel
      return simulated.run(args.controller, args.simulate, args.devices,
                           cfg.token, args.connect_timeout,
                           args.controller_timeout)
    worker_main.leave(worker_main.run(
        args.controller, args.island, args.devices, cfg.token,
        args.data_listen, args.connect_timeout, memory, device_cores,
        args.controller_timeout, args.platform, args.compilation_cache_dir,
        args.storage_root or cfg.storage_root, args.colocated_python))
  if args.command == "connect":
    return _connect(parser, args, cfg)
  if args.command == "cancel":
    return _cancel(parser, args, cfg)
  return _status(parser, args, cfg)


def _cancel(parser: argparse.ArgumentParser, args: argparse.Namespace,
            cfg: config.Config) -> int:
  """Ends client --client of --address."""
  from jax_pathways import admin  # pylint: disable=import-outside-toplevel
  address = args.address or cfg.address
  if not address:
    parser.error(f"give --address or set {config.ADDRESS}")
  try:
    admin.cancel(address, args.client, cfg.token)
  except admin.AdminError as e:
    print(f"jax-pathways cancel: {e}", file=sys.stderr)
    return 1
  print(f"jax-pathways cancel: client {args.client} ended")
  return 0


def _status(parser: argparse.ArgumentParser, args: argparse.Namespace,
            cfg: config.Config) -> int:
  """The status of --address, else of every cluster of this host."""
  from jax_pathways import admin  # pylint: disable=import-outside-toplevel
  from jax_pathways.cluster import host_registry  # pylint: disable=import-outside-toplevel
  address = args.address or cfg.address
  if address:
    targets = [{"kind": "controller", "address": address,
                "token": cfg.token}]
  else:
    # Once per address: a connect to a local controller lists it again.
    by_address: dict[str, dict[str, Any]] = {}
    for entry in host_registry.live():
      by_address.setdefault(entry["address"], entry)
    targets = list(by_address.values())
    if not targets:
      parser.error(f"no cluster of this host is listed in "
                   f"{host_registry.folder()}; give --address or set "
                   f"{config.ADDRESS}")
  answered = 0
  for target in targets:
    try:
      s = admin.status(target["address"], target.get("token") or cfg.token)
    except admin.AdminError as e:
      # One of this host's clusters stopping meanwhile does not fail the
      # others' report: 1 only when none answers.
      print(f"jax-pathways status: {e}", file=sys.stderr)
      continue
    answered += 1
    if args.json:
      print(json.dumps(s if address else dict(
          s, address=target["address"], kind=target["kind"]), indent=1))
    else:
      if not address:
        logs = (f", logs in {target['log_dir']}" if target.get("log_dir")
                else "")
        print(f"== {target['kind']} {target['address']} (pid "
              f"{target.get('pid', '?')}{logs})")
      _print_status(s)
  return 0 if answered else 1


def client_exports(target: str) -> list[str]:
  """The environment of a pathwaysutils-only client of `target`."""
  return [f"export JAX_BACKEND_TARGET={target}",
          "export JAX_PLATFORMS=proxy",
          "export IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS=true"]


def _connect(parser: argparse.ArgumentParser, args: argparse.Namespace,
             cfg: config.Config) -> int:
  """Runs a forwarder until SIGINT/SIGTERM; prints where JAX connects."""
  from jax_pathways.cluster import addresses  # pylint: disable=import-outside-toplevel
  from jax_pathways.cluster import forwarder  # pylint: disable=import-outside-toplevel
  if args.listen is not None and not addresses.is_unix(args.listen):
    parser.error(f"--listen={args.listen}: connect listens on unix:/path "
                 "only (a TCP port would give the token to anyone who "
                 "reaches it)")
  try:
    token = tokens.load(args.token_file) if args.token_file else cfg.token
  except StatusError as e:  # a token file others may read
    parser.error(str(e.status.message))
  if not token:
    parser.error("no cluster token: set JAX_PATHWAYS_TOKEN or give "
                 "--token-file")
  made = None if args.listen else forwarder.socket_dir()
  path = (os.path.join(made, "proxy.sock") if made else
          args.listen[len(addresses.UNIX):])
  try:
    server = forwarder.serve(args.controller, token, path,
                             first_message_timeout=cfg.first_message_timeout)
  except OSError as e:  # PermissionError: a folder others may enter
    print(f"jax-pathways connect: {e}", file=sys.stderr)
    if made:
      shutil.rmtree(made, ignore_errors=True)
    return 2
  from jax_pathways.cluster import host_registry  # pylint: disable=import-outside-toplevel
  listed = host_registry.add("connect", args.controller, token)
  stop = threading.Event()
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda *_: stop.set())
  # What a client without jax_pathways sets, as lines a shell can run.
  # jaxlib's client speaks ALTS (Google Cloud's) unless told otherwise, and
  # fails after its connection timeout with "Invalid credentials"; the
  # socket is this user's only, so plaintext is what it needs.
  for line in client_exports(f"grpc://unix:{path}"):
    print(line)
  sys.stdout.flush()
  while not stop.wait(1.0):
    pass
  host_registry.remove(listed)
  server.stop(grace=2).wait(forwarder.STOP_TIMEOUT_S)
  if made:
    shutil.rmtree(made, ignore_errors=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
