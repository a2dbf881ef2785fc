"""Every environment variable jax_pathways reads, read once, in one place."""
from __future__ import annotations

import dataclasses
import os
import re

from jax_pathways.cluster import tokens
from jax_pathways.status import invalid_argument

# Environment variable names (documented in README.md).
ADDRESS = "JAX_PATHWAYS_ADDRESS"          # grpc://host:port of a running controller
ISLANDS = "JAX_PATHWAYS_ISLANDS"          # embedded cluster: number of islands
DEVICES_PER_ISLAND = "JAX_PATHWAYS_DEVICES_PER_ISLAND"
MAX_IN_FLIGHT = "JAX_PATHWAYS_MAX_IN_FLIGHT"  # launches in flight per island
TOKEN = "JAX_PATHWAYS_TOKEN"              # shared secret of a cluster
TOKEN_FILE = "JAX_PATHWAYS_TOKEN_FILE"    # where a controller keeps it
START_TIMEOUT = "JAX_PATHWAYS_START_TIMEOUT"  # seconds to start a local cluster
LOG_DIR = "JAX_PATHWAYS_LOG_DIR"          # where an embedded cluster logs
VERBOSITY = "JAX_PATHWAYS_VERBOSITY"      # controller/worker log detail (0, 1, 2)
DEVICES = "JAX_PATHWAYS_DEVICES"  # this client's virtual slice: 4 or 2x4
ISLAND = "JAX_PATHWAYS_ISLAND"    # ... on this island
WEIGHT = "JAX_PATHWAYS_WEIGHT"    # this client's share of busy islands
DEVICE_MEMORY = "JAX_PATHWAYS_DEVICE_MEMORY"  # workers: bytes per device (64M)
PIN_ISLANDS = "JAX_PATHWAYS_PIN_ISLANDS"  # embedded cluster: 1 = cores per island
# embedded cluster: seconds of silence after which the controller loses a
# worker (its --worker-timeout)
WORKER_TIMEOUT = "JAX_PATHWAYS_WORKER_TIMEOUT"
# controller and embedded cluster: seconds a program may hold its island
# before the island is taken back (controller/run_bounds.py)
MAX_PROGRAM_SECONDS = "JAX_PATHWAYS_MAX_PROGRAM_SECONDS"
# Workers: where saved arrays may be written and read (storage/paths.py).
STORAGE_ROOT = "JAX_PATHWAYS_STORAGE_ROOT"
PLATFORM = "JAX_PATHWAYS_PLATFORM"  # embedded cluster: the islands' platform
# clients: seconds the controller may leave this process's pings unanswered
# before its JAX calls fail (client/controller_watch.py); 0: wait forever
CONTROLLER_TIMEOUT = "JAX_PATHWAYS_CONTROLLER_TIMEOUT"
# controller: the largest message a call may send, in MiB
MAX_REQUEST_MIB = "JAX_PATHWAYS_MAX_REQUEST_MIB"
# controller and `jax-pathways connect`: seconds a new call may take to send
# its first message (a session its InitRequest) before it is cut off
FIRST_MESSAGE_TIMEOUT = "JAX_PATHWAYS_FIRST_MESSAGE_TIMEOUT"
# controller and workers: MiB of free heap kept before it goes back to the
# system (heap_trim.py; a bad value is warned about, not refused)
HEAP_KEEP_MB = "JAX_PATHWAYS_HEAP_KEEP_MB"
# clients: MiB of freed heap kept for the next transfers' big buffers, which
# come from the heap (client/heap_reuse.py); 0: glibc's default
CLIENT_HEAP_KEEP_MB = "JAX_PATHWAYS_CLIENT_HEAP_KEEP_MB"

DEFAULT_ISLANDS = 2
DEFAULT_DEVICES_PER_ISLAND = 4
# XLA:CPU hangs at >= 64 collective launches in flight; 8-32 is safe.
DEFAULT_MAX_IN_FLIGHT = 16
MAX_SAFE_IN_FLIGHT = 63
DEFAULT_START_TIMEOUT = 120.0
# Heartbeats go both ways every second. The controller loses a silent worker
# after DEFAULT_WORKER_TIMEOUT; a worker exits after DEFAULT_CONTROLLER_TIMEOUT
# of its controller's silence (longer: the controller decides first).
DEFAULT_WORKER_TIMEOUT = 5.0
DEFAULT_CONTROLLER_TIMEOUT = 10.0
MIN_HEARTBEAT_TIMEOUT = 2.0
# Long enough for any pause of a healthy controller; a silence past the
# workers' timeout has cost the islands already (they rejoin once it
# answers), past this one the client's own calls.
DEFAULT_CLIENT_CONTROLLER_TIMEOUT = 60.0
# JAX's client uploads in 1 MiB chunks: only a program with this much
# inlined constant data needs more (protobuf's own bound is 2 GiB).
DEFAULT_MAX_REQUEST_MIB = 256
# JAX's client sends a session's InitRequest as it opens the stream; idle
# streams hold resources (a thread of `connect` each) until then.
DEFAULT_FIRST_MESSAGE_TIMEOUT = 10.0
# What a 512 MiB round trip leaves free in a client (client/heap_reuse.py).
DEFAULT_CLIENT_HEAP_KEEP_MB = 2048


def _int(name: str, default: int, lo: int, hi: int) -> int:
  raw = os.environ.get(name)
  if not raw:
    return default
  try:
    value = int(raw)
  except ValueError:
    raise invalid_argument(
        f"{name}={raw!r} is not an integer; expected {lo}..{hi}") from None
  if not lo <= value <= hi:
    raise invalid_argument(f"{name}={value} is out of range {lo}..{hi}")
  return value


def _float(name: str, default: float, what: str = "a number of seconds"
           ) -> float:
  raw = os.environ.get(name)
  if not raw:
    return default
  try:
    value = float(raw)
  except ValueError:
    raise invalid_argument(
        f"{name}={raw!r} is not {what}") from None
  if value <= 0:
    raise invalid_argument(f"{name}={value} must be positive")
  return value


@dataclasses.dataclass(frozen=True)
class Config:
  address: str | None
  islands: int
  devices_per_island: int
  max_in_flight: int
  token: str | None  # JAX_PATHWAYS_TOKEN, else the token file's
  token_file: str
  start_timeout: float
  log_dir: str | None
  verbosity: int
  devices: str | None
  island: int | None
  weight: float | None
  device_memory: int  # 0: ask the device (unlimited if it does not say)
  pin_islands: bool
  worker_timeout: float | None  # None: the controller's default
  platform: str  # a PJRT platform name: cpu, cuda, rocm, tpu, ...
  controller_timeout: float  # 0: never give up on a silent controller
  max_request_mib: int
  first_message_timeout: float
  storage_root: str | None
  max_program_seconds: float | None  # None: programs run as long as they do
  client_heap_keep_mb: int


def from_env() -> Config:
  token_file = os.environ.get(TOKEN_FILE) or tokens.default_path()
  return Config(
      address=os.environ.get(ADDRESS) or None,
      islands=_int(ISLANDS, DEFAULT_ISLANDS, 1, 64),
      devices_per_island=_int(DEVICES_PER_ISLAND, DEFAULT_DEVICES_PER_ISLAND,
                              1, 1024),
      max_in_flight=_int(MAX_IN_FLIGHT, DEFAULT_MAX_IN_FLIGHT, 1,
                         MAX_SAFE_IN_FLIGHT),
      token=os.environ.get(TOKEN) or tokens.load(token_file),
      token_file=token_file,
      start_timeout=_float(START_TIMEOUT, DEFAULT_START_TIMEOUT),
      log_dir=os.environ.get(LOG_DIR) or None,
      verbosity=_int(VERBOSITY, 0, 0, 3),
      devices=os.environ.get(DEVICES) or None,
      island=_int(ISLAND, -1, 0, 1 << 20) if os.environ.get(ISLAND) else None,
      weight=(_float(WEIGHT, 1.0, "a positive weight")
              if os.environ.get(WEIGHT) else None),
      device_memory=parse_bytes(os.environ.get(DEVICE_MEMORY) or "0",
                                DEVICE_MEMORY),
      pin_islands=bool(_int(PIN_ISLANDS, 0, 0, 1)),
      worker_timeout=(worker_timeout(_float(WORKER_TIMEOUT, 0.0),
                                     WORKER_TIMEOUT)
                      if os.environ.get(WORKER_TIMEOUT) else None),
      platform=platform_name(os.environ.get(PLATFORM) or "cpu", PLATFORM),
      controller_timeout=(
          0.0 if os.environ.get(CONTROLLER_TIMEOUT) == "0" else
          client_controller_timeout(
              _float(CONTROLLER_TIMEOUT, DEFAULT_CLIENT_CONTROLLER_TIMEOUT),
              CONTROLLER_TIMEOUT)),
      max_request_mib=_int(MAX_REQUEST_MIB, DEFAULT_MAX_REQUEST_MIB, 1, 2047),
      first_message_timeout=_float(FIRST_MESSAGE_TIMEOUT,
                                   DEFAULT_FIRST_MESSAGE_TIMEOUT),
      storage_root=os.environ.get(STORAGE_ROOT) or None,
      max_program_seconds=(_float(MAX_PROGRAM_SECONDS, 0.0)
                           if os.environ.get(MAX_PROGRAM_SECONDS) else None),
      client_heap_keep_mb=_int(CLIENT_HEAP_KEEP_MB,
                               DEFAULT_CLIENT_HEAP_KEEP_MB, 0, 1 << 20),
  )


def platform_name(raw: str, what: str) -> str:
  """`raw` if it is a platform name (it goes on the workers' command lines
  and into their JAX_PLATFORMS), else INVALID_ARGUMENT naming `what`."""
  if not re.fullmatch(r"[a-z][a-z0-9_]{0,31}", raw):
    raise invalid_argument(f"{what}={raw!r} is not a platform name "
                           f"(cpu, cuda, rocm, tpu, ...)")
  return raw


def worker_timeout(seconds: float, what: str) -> float:
  """`seconds`, checked as a worker timeout named `what`."""
  if not MIN_HEARTBEAT_TIMEOUT <= seconds < float("inf"):
    raise invalid_argument(
        f"{what}={seconds} must be >= {MIN_HEARTBEAT_TIMEOUT:g} seconds "
        "(workers send a heartbeat every second)")
  return seconds


def max_program_seconds(seconds: float | None, what: str) -> float | None:
  """`seconds`, checked as the bound on a program's run time named `what`
  (None: no bound); ValueError if it is not a positive number."""
  if seconds is not None and not 0 < seconds < float("inf"):
    raise ValueError(f"{what}={seconds} must be > 0 seconds")
  return seconds


def client_controller_timeout(seconds: float, what: str) -> float:
  """`seconds`, checked as how long a client waits for a silent controller
  (named `what`); 0 waits forever."""
  if seconds != 0 and not MIN_HEARTBEAT_TIMEOUT <= seconds < float("inf"):
    raise invalid_argument(
        f"{what}={seconds} must be 0 (wait forever) or >= "
        f"{MIN_HEARTBEAT_TIMEOUT:g} seconds (the client asks every second)")
  return seconds


def parse_bytes(raw: str, what: str) -> int:
  """'4096', '64M', '2G' -> bytes."""
  units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
  text = raw.strip().upper().removesuffix("IB").removesuffix("B")
  unit = text[-1:] if text[-1:] in units else ""
  try:
    value = int(float(text.removesuffix(unit)) * units[unit])
  except ValueError:
    raise invalid_argument(f"{what}={raw!r} is not a size like 64M or "
                           "2G") from None
  if value < 0:
    raise invalid_argument(f"{what}={raw!r} is negative")
  return value
