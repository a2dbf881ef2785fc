"""The worker process: joins a controller and runs its island's ops.

    jax-pathways worker --controller HOST:PORT [--island N] [--devices N]
        [--platform cpu|cuda|rocm|tpu] [--device-memory 16G]
        [--device-cores 0-3] [--controller-timeout 10]

--platform picks the PJRT platform of the island's devices (default: the
one JAX finds on this host); every platform but CPU comes from JAX's own
PJRT plugin (island_client.island_client).

The cluster token comes from JAX_PATHWAYS_TOKEN. The worker exits when the
controller tells it to, when the controller connection is lost, or when the
controller sends nothing (not even its heartbeat) for `controller_timeout`
seconds: a stopped or cut-off controller leaves no orphaned workers. When
the connection ends, the worker asks the controller (a "probe" handshake)
whether it is still up: then it has dropped this worker (declared it lost,
say after a SIGSTOP past its --worker-timeout), and a new worker should
take the island's place.

Exit codes, for restart policies (worker/in_place.py in a Kubernetes pod,
Ray's actor restarts, the embedded cluster's supervisor):
  0  the controller told it to stop, or is gone (dead, or silent and not
     answering): a new worker could not join it either
  1  an unexpected error
  2  EXIT_SETUP: bad --device-cores, a --platform or --devices this host
     lacks, or the worker could not join the controller: a restart on the
     same host with the same flags fails the same way, so Ray and a pod
     make none (the embedded supervisor gives up after its quick restarts)
  3  EXIT_LOST: the controller is up but dropped this worker: start a new one
"""
from __future__ import annotations

import os
import socket
import sys
import threading
from typing import Any, NoReturn

from absl import logging

EXIT_SETUP = 2
EXIT_LOST = 3
# How long a worker whose connection ended waits for its controller to
# answer before taking it for gone (stopped or cut off).
PROBE_TIMEOUT_S = 2.0
# After the connection to the controller ended, how long the op loop may
# take to notice before the worker leaves without it: the loop may be
# inside a program that never ends (XLA:CPU runs a program of one device
# on the thread that launches it), the reason the controller dropped it.
STUCK_LOOP_S = 5.0


def run(controller: str, island: int | None, devices: int | None,
        token: str | None, data_listen: str, connect_timeout: float,
        device_memory: int = 0, device_cores: list[int] | None = None,
        controller_timeout: float = 10.0, platform: str | None = None,
        compilation_cache_dir: str | None = None,
        storage_root: str | None = None,
        colocated_python: bool = False) -> int:
  """Joins `controller` and serves until told to stop; returns an exit code.
  `devices`, `platform`: see island_client.island_client.
  `device_cores`: the CPU cores the devices compute on (cluster/cores.py).
  `compilation_cache_dir`: where compiled programs are kept across workers
  (worker/compilation_cache.py); None: nowhere.
  `storage_root`: where persistence requests may save and restore arrays
  (storage/paths.py); None: nowhere.
  `colocated_python`: whether clients may run colocated Python functions
  here (in processes of their own; colocated/)."""
  configure_jax(platform)
  # pylint: disable=import-outside-toplevel
  from jax_pathways import _core
  from jax_pathways import heap_trim
  from jax_pathways import threads
  from jax_pathways.cluster import addresses
  from jax_pathways.cluster import cores
  from jax_pathways.wire import handshake
  from jax_pathways.worker import callback_binding as worker_callbacks
  from jax_pathways.worker.colocated_processes import ColocatedProcesses
  from jax_pathways.worker.compilation_cache import CompilationCache
  from jax_pathways.worker.island_client import PlatformError
  from jax_pathways.worker.peers import Peers
  from jax_pathways.worker.pjrt_backend import PjrtBackend
  from jax_pathways.worker.transfers import Transfers
  from jax_pathways.worker.worker import Worker

  compilation_cache = None
  if compilation_cache_dir:
    try:
      compilation_cache = CompilationCache(compilation_cache_dir)
    except OSError as e:  # a cache is worth less than a refused worker
      logging.warning("jax-pathways worker: no compilation cache: %s", e)
  try:
    with cores.pinned(device_cores):
      backend = PjrtBackend(devices, device_cores, platform,
                            compilation_cache)
  except ValueError as e:
    print(f"jax-pathways worker: --device-cores: {e}", file=sys.stderr)
    return EXIT_SETUP
  except PlatformError as e:
    print(f"jax-pathways worker: --platform {platform or '(default)'}: {e}",
          file=sys.stderr)
    return EXIT_SETUP
  peers = Peers(token, data_listen)
  # jaxlib's transfer server does not authenticate: only between workers
  # of one host (its ids are random; other hosts use the token's links).
  transfers = (Transfers(backend.client, "127.0.0.1")
               if addresses.is_loopback(data_listen) else None)
  hello = worker_hello(backend, island, device_memory, peers.address,
                       transfers.address if transfers else "")
  try:
    sock, welcome = addresses.dial(controller, token, hello, connect_timeout)
  except (OSError, ValueError, handshake.HandshakeError) as e:
    print(f"jax-pathways worker: could not join the controller at "
          f"{controller}: {e}", file=sys.stderr)
    peers.close()
    return EXIT_SETUP
  peers.island = backend.island = int(welcome["island"])
  # Where gloo listens, for every generation of the global client.
  backend.gloo_host = ("127.0.0.1" if addresses.is_loopback(data_listen)
                       else data_listen.rpartition(":")[0].strip("[]"))
  if backend.gloo_host in ("0.0.0.0", "::"):
    backend.gloo_host = socket.gethostname()
  # Every worker must rewrite programs alike (or gloo hangs).
  backend.rank_order_reductions = welcome.get("reduction_order") == "rank"
  if int(welcome["islands"]) > 1 and not backend.spans_islands:
    logging.warning("island %d runs on %s: it runs its own programs only, "
                    "none that span islands (those need CPU islands so "
                    "far)", peers.island, backend.platform)
  logging.info("worker pid %d joined as island %d (%d %s devices%s); data "
               "at %s", os.getpid(), peers.island, len(backend.devices),
               backend.platform,
               f" on cores {cores.format_list(device_cores)}"
               if device_cores else "", peers.address)
  # Programs with callbacks reach their clients through the controller,
  # on a connection of their own, made when the first one needs it.
  backend.callback_link = worker_callbacks.Link(
      lambda: _callbacks_connection(controller, token, peers.island,
                                    connect_timeout))
  # From here on the worker heartbeats and watches the controller's.
  executor = _core.Executor(sock.detach(), controller, controller_timeout)
  heap_trim.start()  # what a big transfer freed goes back to the system
  served = threading.Event()
  threads.start(_leave_if_stuck, "jp-leave-stuck", executor, served,
                controller, token, peers.island)
  try:
    colocated = ColocatedProcesses(peers.island, colocated_python)
    ended = Worker(executor, backend, peers, transfers, storage_root,
                   colocated).run()
  finally:
    served.set()
    executor.shutdown()
    peers.close()
  if ended is None:
    return 0
  return _exit_code(ended, controller, token, peers.island)


def configure_jax(platform: str | None) -> None:
  """Before anything initializes JAX's backends: this process must keep
  every dtype the client sends; it initializes only the platform asked for,
  and is never a client of a controller itself."""
  if platform:
    os.environ["JAX_PLATFORMS"] = platform
  else:
    wanted = [p for p in os.environ.get("JAX_PLATFORMS", "").split(",")
              if p and p != "proxy"]
    os.environ["JAX_PLATFORMS"] = ",".join(wanted)
  os.environ.pop("JAX_BACKEND_TARGET", None)
  os.environ["XLA_FLAGS"] = without_rendezvous_abort(
      os.environ.get("XLA_FLAGS", ""))
  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_enable_x64", True)


# XLA:CPU aborts the process when a device of a program waits for the
# others in a collective for 20 + 40 s (its "terminate" timeout, read once
# from XLA_FLAGS): a host callback that took a minute inside a program of
# several devices took its whole island down. Here a program runs as long
# as its callbacks take.
_TERMINATE = "--xla_cpu_collective_call_terminate_timeout_seconds"


def without_rendezvous_abort(flags: str) -> str:
  """XLA_FLAGS `flags` with XLA:CPU's rendezvous abort turned off."""
  kept = []
  for flag in flags.split():
    if flag.startswith(_TERMINATE + "="):
      if flag != _TERMINATE + "=-1":
        logging.warning("%s in XLA_FLAGS is ignored: a worker's programs "
                        "run as long as their host callbacks take", flag)
      continue
    kept.append(flag)
  return " ".join([*kept, _TERMINATE + "=-1"])


def worker_hello(backend: Any, island: int | None, device_memory: int,
                 data_address: str, transfer_address: str) -> dict[str, Any]:
  """What the worker tells the controller of itself and its island's devices
  (resources/topology.py admits it; the client sees platform and
  device_kind)."""
  import jax  # pylint: disable=import-outside-toplevel
  from jax_pathways import _core  # pylint: disable=import-outside-toplevel
  from jax_pathways.programs import custom_calls  # pylint: disable=import-outside-toplevel
  return {
      "role": "worker",
      "island": island,
      "num_devices": len(backend.devices),
      # The island's device memory, which the controller budgets: what the
      # platform reports (bytes_limit) unless --device-memory says.
      "memory_bytes": (device_memory or backend.memory_per_device()) *
                      len(backend.devices),
      # What a program here could use at most, if the devices say nothing
      # (CPU devices use the host's: programs/custom_calls.py).
      "host_memory_bytes": _host_memory(),
      "platform": backend.platform,
      "device_kind": backend.devices[0].device_kind,
      "pid": os.getpid(),
      "host": socket.gethostname(),
      "data_address": data_address,
      "transfer_address": transfer_address,
      "wire_version": _core.WIRE_VERSION,
      "jax_version": jax.__version__,
      # What programs on this island may call (programs/custom_calls.py).
      "custom_call_targets": sorted(
          custom_calls.registered(backend.platform)),
      # Asked of the client by jax.export (InitResponse's attributes).
      "serialize_with_sdy": bool(backend.client.serialize_with_sdy),
  }


def _host_memory() -> int:
  try:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  except (ValueError, OSError):
    return 0


def _hello(role: str, island: int) -> dict[str, Any]:
  """The hello of this worker's other connections to its controller."""
  return {"role": role, "island": island, "pid": os.getpid(),
          "host": socket.gethostname()}


def _callbacks_connection(controller: str, token: str | None, island: int,
                          timeout: float) -> socket.socket:
  """A new connection for callbacks (worker/callback_binding.py),
  authenticated as island `island`'s worker."""
  # pylint: disable=import-outside-toplevel
  from jax_pathways.cluster import addresses
  sock, _ = addresses.dial(controller, token, _hello("callbacks", island),
                           timeout)
  return sock


def leave(code: int) -> NoReturn:
  """Ends this worker process with `code` now. Its threads may still be
  inside jaxlib (building a global client, in a collective): finalizing
  the interpreter would stop each as it comes back for the GIL, and that
  stop, through jaxlib's C++ frames, aborts the process (a clean stop
  then reads as SIGABRT, not 0)."""
  logging.flush()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


def _leave_if_stuck(executor: Any, served: threading.Event, controller: str,
                    token: str | None, island: int) -> None:
  """Ends the process if the op loop has not returned STUCK_LOOP_S after
  the connection to the controller ended."""
  while not served.wait(0.5):
    ended = executor.lost()
    if not ended:
      continue
    if served.wait(STUCK_LOOP_S):
      return
    logging.error("the op loop is still inside an op %.0f s after the "
                  "connection to the controller ended (%s): leaving without "
                  "it", STUCK_LOOP_S, ended)
    leave(_exit_code(ended, controller, token, island))


def _exit_code(ended: str, controller: str, token: str | None,
               island: int) -> int:
  """After the connection ended (`ended` says how): EXIT_LOST if the
  controller answers a probe, else 0 (it is gone)."""
  # pylint: disable=import-outside-toplevel
  from jax_pathways.cluster import addresses
  from jax_pathways.wire import handshake
  try:
    with addresses.connect(controller, PROBE_TIMEOUT_S) as sock:
      answer = handshake.connect(sock, token, _hello("probe", island),
                                 PROBE_TIMEOUT_S)
  except (OSError, handshake.HandshakeError) as e:
    logging.warning("controller is gone (%s; it does not answer: %s); "
                    "worker exits", ended, e)
    return 0
  logging.error("the controller at %s is up but has dropped this worker of "
                "island %d: %s (%s); worker exits with code %d so that a new "
                "worker takes the island's place", controller, island,
                answer.get("why"), ended, EXIT_LOST)
  return EXIT_LOST
