"""The controller process.

    jax-pathways controller --islands N [--listen ADDR] [--worker-listen ADDR]

Prints one JSON line {"address", "worker_address", "pid"} on stdout once it is
listening (the embedded cluster reads it), then serves until SIGTERM/SIGINT,
or after SIGUSR1 until its last client has disconnected (so a client that is
exiting can close its session cleanly). The cluster token comes from
JAX_PATHWAYS_TOKEN or the token file; without either the controller makes one
(token()).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

from absl import logging

# After SIGUSR1, how long to wait for clients to disconnect.
DRAIN_TIMEOUT_S = 30.0


def token(cfg: Any, insecure: bool, *listen: str) -> str | None:
  """The cluster token: JAX_PATHWAYS_TOKEN, the token file's, or a new one
  kept in the token file; None only with --insecure, on loopback."""
  # pylint: disable=import-outside-toplevel
  from jax_pathways.cluster import addresses, tokens
  from jax_pathways.status import invalid_argument
  if insecure:
    for address in listen:
      if not addresses.is_loopback(address):
        raise invalid_argument(
            f"--insecure: refusing to listen on {address} without a "
            "cluster token; drop --insecure (a token is made for you) or "
            "set JAX_PATHWAYS_TOKEN")
    logging.warning("--insecure: any local process may use this cluster")
    return None
  if cfg.token:
    return cfg.token
  made = tokens.load_or_create(cfg.token_file)
  logging.info("cluster token kept in %s (mode 0600): workers, clients and "
               "`jax-pathways status` on this host read it from there; "
               "elsewhere set JAX_PATHWAYS_TOKEN to its contents",
               cfg.token_file)
  return made


def _serve(controller: Any, parent_pid: int | None) -> None:
  """Until SIGTERM/SIGINT, a drain's end, or the parent's death."""
  stop = threading.Event()
  drain_until: list[float] = []
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: stop.set())
  signal.signal(signal.SIGUSR1,
                lambda *_: drain_until.append(time.monotonic() + DRAIN_TIMEOUT_S))
  while not stop.wait(0.1):
    if drain_until and (not controller.service.sessions or
                        time.monotonic() > drain_until[0]):
      return
    if parent_pid is not None and os.getppid() != parent_pid:
      logging.warning("the process that started this controller is gone; "
                      "stopping")
      return


def run(islands: int, listen: str, worker_listen: str,
        coordinator_listen: str, token: str | None, max_in_flight: int,
        parent_pid: int | None, memory_wait_s: float | None,
        reduction_order: str, worker_timeout_s: float | None,
        max_program_s: float | None = None) -> int:
  # pylint: disable=import-outside-toplevel
  from jax_pathways.cluster import host_registry
  from jax_pathways.controller.controller import Controller
  controller = Controller(islands, listen, worker_listen, coordinator_listen,
                          token, max_in_flight, memory_wait_s, reduction_order,
                          worker_timeout_s, max_program_s)
  controller.start()
  print(json.dumps({"address": controller.address,
                    "worker_address": controller.worker_address,
                    "pid": os.getpid()}), flush=True)
  listed = host_registry.add("controller", controller.address, token,
                             log_dir=os.getcwd())
  try:
    _serve(controller, parent_pid)
  finally:
    host_registry.remove(listed)
  controller.stop()
  sys.stdout.flush()
  return 0
