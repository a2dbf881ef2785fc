"""jax_plugins entry point: JAX's own IFRT-proxy client as the 'proxy' backend.

JAX imports this module when it discovers backends and calls initialize(),
which only registers a backend factory (cheap, no connection). The factory
runs when JAX initializes the 'proxy' platform: it connects jaxlib's built-in
IFRT-proxy client to the controller named by `jax_backend_target`, and
lets jax.make_mesh span islands (client/make_mesh.py: the one JAX function
jax_pathways replaces). Scripts can also select it with
JAX_PLATFORMS=proxy JAX_BACKEND_TARGET=grpc://host:port.
"""
from __future__ import annotations

import atexit
import os
import time
import weakref
from typing import Any, Callable

from absl import logging

from jax_pathways import config
from jax_pathways.client import controller_watch
from jax_pathways.client import contiguous_uploads
from jax_pathways.client import cross_client
from jax_pathways.client import flusher
from jax_pathways.client import heap_reuse
from jax_pathways.client import host_callbacks
from jax_pathways.client import make_mesh
from jax_pathways.client import stderr_filter
from jax_pathways.cluster import addresses
from jax_pathways.colocated import packages
from jax_pathways.wire.session_keys import (CALLBACKS_KEY, DEVICES_KEY,
                                            ISLAND_KEY, PACKAGES_KEY,
                                            TOKEN_KEY)

BACKEND_NAME = "proxy"
CONNECT_TIMEOUT_S = 60

_token: str | None = None
_slice: dict[str, str] = {}  # the virtual slice asked for (DEVICES_KEY, ...)
_controller_timeout: float | None = None  # None: JAX_PATHWAYS_CONTROLLER_TIMEOUT
_before_connect: Callable[[], None] | None = None  # initialize()'s checks
_closed = False
connected = False  # a client was made in this process
_client: weakref.ref | None = None  # the newest one
_quiet_end_registered = False


def initialize() -> None:
  """Called by JAX during backend discovery."""
  register()


def register() -> None:
  from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
  # fail_quietly: a JAX that never asked for 'proxy' is not disturbed by an
  # unconfigured jax_pathways install.
  xla_bridge.register_backend_factory(BACKEND_NAME, _make_client,
                                      priority=-1, fail_quietly=True)


def configure(token: str | None, wanted: dict[str, str],
              controller_timeout: float | None = None,
              before_connect: Callable[[], None] | None = None) -> None:
  global _token, _slice, _closed, _controller_timeout, _before_connect
  _token = token
  _slice = dict(wanted)
  _controller_timeout = controller_timeout
  _before_connect = before_connect
  _closed = False
  _register_quiet_end()


def close() -> None:
  """After jax_pathways.shutdown(): JAX must not reconnect."""
  global _closed
  _closed = True
  host_callbacks.stop()
  controller_watch.stop()


def _target() -> str:
  import jax  # pylint: disable=import-outside-toplevel
  target = jax.config.read("jax_backend_target") or os.environ.get(
      "JAX_BACKEND_TARGET", "")
  if not target:
    raise RuntimeError(
        "jax_pathways: no controller to connect to. Call "
        "jax_pathways.initialize() before using JAX, or set "
        "JAX_BACKEND_TARGET=grpc://host:port")
  return addresses.grpc_url(target)


def _preflight(target: str, token: str | None) -> None:
  """Fails fast, with the real reason, where jaxlib's client would retry for
  CONNECT_TIMEOUT_S and then report only CANCELLED: a wrong token or no
  controller at all. A proxy server that is not jax_pathways' passes."""
  import grpc  # pylint: disable=import-outside-toplevel
  from jax_pathways import admin  # pylint: disable=import-outside-toplevel
  deadline = time.monotonic() + CONNECT_TIMEOUT_S
  said_after, waiting_said = time.monotonic() + 3.0, False
  while True:
    try:
      admin.status(target, token, timeout=5.0)
      break
    except admin.AdminError as e:
      if e.code == grpc.StatusCode.UNAUTHENTICATED:
        raise RuntimeError(
            f"jax_pathways: the controller at {target} refused this "
            "process's cluster token; pass jax_pathways.initialize(address, "
            "token=...) or set JAX_PATHWAYS_TOKEN to the controller's token"
        ) from None
      if e.code not in (grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED):
        return  # reachable; not ours to judge
      if time.monotonic() > deadline:
        raise RuntimeError(f"jax_pathways: no controller answers at {target} "
                           f"after {CONNECT_TIMEOUT_S} s ({e})") from None
      if not waiting_said and time.monotonic() > said_after:
        waiting_said = True
        logging.warning("jax_pathways: waiting for a controller to answer at "
                        "%s (up to %d s; is it running, and is that its "
                        "address?)", target, CONNECT_TIMEOUT_S)
      time.sleep(0.5)
  if _slice:
    try:
      admin.check_slice(target, _slice.get(DEVICES_KEY),
                        _slice.get(ISLAND_KEY), token)
    except admin.AdminError as e:
      if e.code in (grpc.StatusCode.RESOURCE_EXHAUSTED,
                    grpc.StatusCode.INVALID_ARGUMENT):
        raise RuntimeError(f"jax_pathways: {e.details}") from None


def _make_client() -> Any:
  global connected, _client
  if _closed:
    raise RuntimeError("jax_pathways.shutdown() was called in this process; "
                       "JAX has no backend left here")
  from jax._src.lib import ifrt_proxy  # pylint: disable=import-outside-toplevel
  # jaxlib's client refuses plaintext channels unless told; the controller
  # listens on loopback by default and checks a token when it does not.
  os.environ.setdefault("IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS", "true")
  options = ifrt_proxy.ClientConnectionOptions()
  options.connection_timeout_in_seconds = CONNECT_TIMEOUT_S
  # No on_disconnect callback: jaxlib may call it during interpreter
  # finalization, and calling into Python then aborts the process. The
  # embedded cluster watches its controller instead (cluster/local_cluster).
  token = _token or os.environ.get("JAX_PATHWAYS_TOKEN")
  data = {k: v.encode() for k, v in _slice.items()}
  if token:
    data[TOKEN_KEY] = token.encode()
  # This process serves its programs' callbacks (client/host_callbacks.py).
  client_id = host_callbacks.new_client_id()
  data[CALLBACKS_KEY] = client_id.encode()
  data[PACKAGES_KEY] = packages.describe().encode()
  options.initialization_data = data
  target = _target()
  if _before_connect is not None:
    _before_connect()
  _preflight(target, token)
  make_mesh.install()
  host_callbacks.install()
  cross_client.install()
  contiguous_uploads.install()
  heap_reuse.install(config.from_env().client_heap_keep_mb)

  def connect() -> Any:
    # Each channel jaxlib makes warns that it was told to use plaintext.
    with stderr_filter.Dropping("credentials"):
      return ifrt_proxy.get_client(target, options)

  client = flusher.calm_new_threads(connect)
  host_callbacks.adopt(client)
  host_callbacks.start(target, token, client_id)
  controller_watch.start(target, _controller_timeout
                         if _controller_timeout is not None
                         else config.from_env().controller_timeout)
  connected = True
  _client = weakref.ref(client)
  _register_quiet_end()
  return client


def client_alive() -> bool:
  """Whether the newest client still exists (the program holds arrays or
  executables of it)."""
  return _client is not None and _client() is not None


def _register_quiet_end() -> None:
  """Once per process. initialize() registers it before its own exit hook,
  so that the cluster's last words (a dead controller's report) come out
  before stderr is filtered."""
  global _quiet_end_registered
  if not _quiet_end_registered:
    _quiet_end_registered = True
    atexit.register(_quiet_session_end)


def _quiet_session_end() -> None:
  if not connected:
    return
  # jaxlib's client, destroyed later at exit (by JAX's atexit handler, which
  # runs after this one, or as the interpreter finalizes), logs its session's
  # end as a warning with a stack trace. Never closed: the filter lasts until
  # this process has exited.
  stderr_filter.Dropping("session_end")
