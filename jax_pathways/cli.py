"""The `jax-pathways` command: controller, worker, status and connect.

    jax-pathways controller --islands 2 [--listen 127.0.0.1:8470] [--worker-listen 127.0.0.1:8471]
    jax-pathways worker --controller HOST:PORT [--island 0] [--devices 4] [--device-cores 0-3]
    jax-pathways status [--address grpc://HOST:PORT] [--json]
    jax-pathways connect --controller HOST:PORT [--listen unix:PATH] [--token-file FILE]

The cluster token is read from JAX_PATHWAYS_TOKEN by all three, else from
the file a controller keeps it in (JAX_PATHWAYS_TOKEN_FILE, by default
~/.jax_pathways/token, mode 0600): a controller started without a token makes
one there, unless --insecure (loopback only) asks for none. `connect` serves
JAX clients that cannot send the token (pathwaysutils) on a private Unix
socket and adds it to their sessions.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import shutil
import sys
import time
from typing import Any, Sequence

from absl import flags
from absl import logging

from jax_pathways import config
from jax_pathways.cluster import cores


def _setup_logging(verbosity: int) -> None:
  # A crash in native code leaves every thread's Python stack in the log.
  faulthandler.enable(all_threads=True)
  flags.FLAGS.mark_as_parsed()  # absl logging without absl.app
  logging.use_absl_handler()
  logging.set_verbosity(verbosity)  # 0: INFO; 1, 2: vlog levels


def _print_status(s: dict[str, Any]) -> None:
  print(f"jax_pathways {s['version']}  up {s['uptime_s']} s  "
        f"islands {len(s['islands'])}/{s['expected_islands']}  "
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


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="jax-pathways", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest="command", required=True)

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
                 help="CPU devices this worker emulates (default 4)")
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

  s = sub.add_parser("status", help="show a controller's islands and queues")
  s.add_argument("--address", default=None,
                 help=f"grpc://HOST:PORT (default ${config.ADDRESS})")
  s.add_argument("--json", action="store_true", help="print raw JSON")

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

  args = parser.parse_args(argv)
  try:
    cfg = config.from_env()
  except Exception as e:  # pylint: disable=broad-except
    print(f"jax-pathways: {e}", file=sys.stderr)
    return 2

  if args.command == "controller":
    _setup_logging(cfg.verbosity)
    from jax_pathways.controller import main as controller_main  # pylint: disable=import-outside-toplevel
    max_in_flight = args.max_in_flight or cfg.max_in_flight
    if not 1 <= max_in_flight <= config.MAX_SAFE_IN_FLIGHT:
      parser.error(f"--max-in-flight={max_in_flight} must be in "
                   f"1..{config.MAX_SAFE_IN_FLIGHT} (XLA:CPU hangs at 64)")
    if args.memory_wait is not None and not args.memory_wait > 0:
      parser.error(f"--memory-wait={args.memory_wait} must be > 0 seconds")
    if args.worker_timeout is not None and not args.worker_timeout >= 2:
      parser.error(f"--worker-timeout={args.worker_timeout} must be >= 2 "
                   "seconds (workers send a heartbeat every second)")
    worker_timeout = (args.worker_timeout if args.worker_timeout is not None
                      else cfg.worker_timeout)
    return controller_main.run(args.islands or cfg.islands, args.listen,
                               args.worker_listen, args.coordinator_listen,
                               controller_main.token(cfg, args.insecure,
                                                     args.listen,
                                                     args.worker_listen,
                                                     args.coordinator_listen),
                               max_in_flight, args.parent_pid,
                               args.memory_wait, args.reduction_order,
                               worker_timeout)
  if args.command == "worker":
    _setup_logging(cfg.verbosity)
    from jax_pathways.worker import main as worker_main  # pylint: disable=import-outside-toplevel
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
    return worker_main.run(args.controller, args.island,
                           args.devices or cfg.devices_per_island, cfg.token,
                           args.data_listen, args.connect_timeout, memory,
                           device_cores, args.controller_timeout)
  if args.command == "connect":
    _setup_logging(cfg.verbosity)
    return _connect(parser, args, cfg)
  from jax_pathways import admin  # pylint: disable=import-outside-toplevel
  address = args.address or cfg.address
  if not address:
    parser.error(f"give --address or set {config.ADDRESS}")
  try:
    s = admin.status(address, cfg.token)
  except admin.AdminError as e:
    print(f"jax-pathways status: {e}", file=sys.stderr)
    return 1
  if args.json:
    print(json.dumps(s, indent=1))
  else:
    _print_status(s)
  return 0


def _connect(parser: argparse.ArgumentParser, args: argparse.Namespace,
             cfg: config.Config) -> int:
  """Runs a forwarder until SIGINT/SIGTERM; prints where JAX connects."""
  import signal  # pylint: disable=import-outside-toplevel
  import threading  # pylint: disable=import-outside-toplevel
  from jax_pathways.cluster import addresses  # pylint: disable=import-outside-toplevel
  from jax_pathways.cluster import forwarder  # pylint: disable=import-outside-toplevel
  from jax_pathways.cluster import tokens  # pylint: disable=import-outside-toplevel
  if args.listen is not None and not addresses.is_unix(args.listen):
    parser.error(f"--listen={args.listen}: connect listens on unix:/path "
                 "only (a TCP port would give the token to anyone who "
                 "reaches it)")
  from jax_pathways.status import StatusError  # pylint: disable=import-outside-toplevel
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
    server, fwd = forwarder.serve(args.controller, token, path)
  except OSError as e:  # PermissionError: a folder others may enter
    print(f"jax-pathways connect: {e}", file=sys.stderr)
    if made:
      shutil.rmtree(made, ignore_errors=True)
    return 2
  stop = threading.Event()
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda *_: stop.set())
  print(f"JAX_BACKEND_TARGET=grpc://unix:{path}", flush=True)
  while not stop.wait(1.0):
    pass
  server.stop(grace=2).wait(5)
  fwd.close()
  if made:
    shutil.rmtree(made, ignore_errors=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
