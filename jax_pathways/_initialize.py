"""initialize() and shutdown(): connect this process's JAX to a controller.

With no address, start an embedded local cluster (a controller and one worker
per island, as child processes); with one, join a running controller. Either
way JAX's own IFRT-proxy client becomes the default backend, named 'proxy'
(JAX's CPU backend stays beside it unless JAX_PLATFORMS says otherwise).
"""
from __future__ import annotations

import atexit
import contextlib
import gc
import os
import threading
from typing import Sequence

from absl import logging

from jax_pathways import config
from jax_pathways.client import make_mesh
from jax_pathways.client import plugin
from jax_pathways.client import stderr_filter
from jax_pathways.cluster import addresses
from jax_pathways.cluster import cores
from jax_pathways.cluster.local_cluster import LocalCluster
from jax_pathways.resources.virtual_slice import SliceRequest
from jax_pathways.status import StatusError
from jax_pathways.wire import session_keys

_lock = threading.Lock()
_cluster: LocalCluster | None = None
_address: str | None = None
_token: str | None = None
_shut_down = False  # shutdown() ran in this process
_at_exit_registered = False
_cache_warned = False
# How long shutdown() waits for a held client's logged session end.
_SESSION_END_WAIT_S = 5.0


def _normalize(address: str) -> str:
  address = addresses.grpc_url(address)
  if not address.startswith("grpc://"):
    raise ValueError(f"jax_pathways address {address!r} must look like "
                     "grpc://host:port")
  return address


def initialize(address: str | None = None, *, islands: int | None = None,
               devices_per_island: int | None = None,
               max_in_flight: int | None = None,
               token: str | None = None,
               devices: int | Sequence[int] | None = None,
               island: int | None = None,
               weight: float | None = None,
               reduction_order: str | None = None,
               pin_islands: bool | None = None,
               worker_timeout: float | None = None,
               restart_workers: bool | None = None,
               platform: str | None = None,
               controller_timeout: float | None = None,
               storage_root: str | None = None) -> str:
  """Makes JAX in this process run on jax_pathways; returns the address.

  Args:
    address: grpc://host:port of a running controller. None (and no
      JAX_PATHWAYS_ADDRESS) starts an embedded local cluster.
    islands: embedded cluster: number of islands (default 2).
    devices_per_island: embedded cluster: CPU devices per island (default 4).
    max_in_flight: embedded cluster: launches in flight per island.
    token: the cluster token of a remote controller (JAX_PATHWAYS_TOKEN).
    devices: this process's virtual slice: a device count (4) or a mesh
      shape ((2, 4)); JAX then sees devices 0..n-1, placed by the
      controller on physical devices that other clients may share
      (JAX_PATHWAYS_DEVICES=4 or 2x4). None: every device of the cluster.
    island: keep the slice on this island (JAX_PATHWAYS_ISLAND).
    weight: this process's share of devices other clients also use, when
      they are all busy, relative to the others' weights (default 1;
      JAX_PATHWAYS_WEIGHT).
    reduction_order: embedded cluster: 'rank' (default) makes float sums of
      programs that span islands add in the order one host would (the same
      bits; such programs compile twice); 'ring' leaves them to gloo's ring
      all-reduce (the last bits may differ).
    pin_islands: embedded cluster (Linux): deal this process's CPU cores to
      the islands, each island's devices computing only on its own (one
      core each, shared round robin, when there are more islands than
      cores); the workers' other threads and the controller run on any
      core (JAX_PATHWAYS_PIN_ISLANDS=1). Default: the OS places everything.
    worker_timeout: embedded cluster: seconds a worker may send nothing
      (it sends a heartbeat every second) before the controller declares it
      lost and fails its island's work (>= 2; default 5;
      JAX_PATHWAYS_WORKER_TIMEOUT).
    restart_workers: embedded cluster: start a worker that dies again, in
      its island's place (default True): the island's programs run on it
      again, its old arrays stay failed (DATA_LOSS). A worker that keeps
      dying right after it starts is given up on after a few tries.
    platform: embedded cluster: the islands' PJRT platform (default 'cpu':
      emulated devices; JAX_PATHWAYS_PLATFORM). 'cuda' or 'rocm': island i
      runs on the i-th `devices_per_island` GPUs this process may use (the
      platform's *_VISIBLE_DEVICES variable; the worker needs JAX's plugin
      for it).
    storage_root: embedded cluster: the directory under which the islands'
      workers save and restore arrays for persistence requests (orbax's
      Pathways handler, pathwaysutils; docs/storage.md). Default
      $JAX_PATHWAYS_STORAGE_ROOT, else the filesystem root: the embedded
      cluster's workers are this user's processes on this host and reach
      what this process reaches.
    controller_timeout: seconds the controller may leave this process's
      pings (one a second) unanswered before its JAX calls fail with
      UNAVAILABLE instead of waiting on (default 60; 0: wait forever;
      JAX_PATHWAYS_CONTROLLER_TIMEOUT).
  """
  global _cluster, _address, _token, _at_exit_registered
  from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  with _lock:
    if _address is not None:
      if address is None or _normalize(address) == _address:
        return _address
      raise RuntimeError(
          f"jax_pathways is already initialized with {_address}; call "
          "jax_pathways.shutdown() first")
    if xla_bridge.backends_are_initialized() and _shut_down:
      raise RuntimeError(
          "jax_pathways.initialize() after jax_pathways.shutdown() must run "
          "before JAX initializes a backend again, but this process used JAX "
          "in between (e.g. jax.devices() on another platform). Call "
          "initialize() right after shutdown(), or restart the process.")
    if xla_bridge.backends_are_initialized():
      raise RuntimeError(
          "jax_pathways.initialize() must run before JAX initializes its "
          "backends, but this process already used JAX (e.g. jax.devices(), "
          "jnp.ones, jax.jit). Call jax_pathways.initialize() right after "
          "`import jax_pathways`, at the top of the program.")
    cfg = config.from_env()
    if controller_timeout is not None:
      try:
        config.client_controller_timeout(
            controller_timeout, "jax_pathways.initialize: controller_timeout")
      except StatusError as e:
        raise ValueError(e.status.message) from None
    address = address or cfg.address
    wanted = _slice_request(devices if devices is not None else cfg.devices,
                            island if island is not None else cfg.island)
    weight = weight if weight is not None else cfg.weight
    if weight is not None:
      if not 0 < weight < float("inf"):
        raise ValueError(f"jax_pathways.initialize: weight={weight} must be "
                         "a positive number")
      wanted[session_keys.WEIGHT_KEY] = repr(float(weight))
    if address is None:
      if token is not None:
        raise ValueError("token= is for joining a running controller; an "
                         "embedded cluster makes its own")
      if reduction_order not in (None, "rank", "ring"):
        raise ValueError(f"jax_pathways.initialize: reduction_order="
                         f"{reduction_order!r} must be 'rank' or 'ring'")
      pin = pin_islands if pin_islands is not None else cfg.pin_islands
      try:
        if worker_timeout is not None:
          config.worker_timeout(worker_timeout,
                                "jax_pathways.initialize: worker_timeout")
        if platform is not None:
          config.platform_name(platform, "jax_pathways.initialize: platform")
      except StatusError as e:
        raise ValueError(e.status.message) from None
      n_islands = islands if islands is not None else cfg.islands
      cluster = LocalCluster(
          n_islands,
          devices_per_island if devices_per_island is not None
          else cfg.devices_per_island,
          max_in_flight if max_in_flight is not None else cfg.max_in_flight,
          log_dir=cfg.log_dir, start_timeout=cfg.start_timeout,
          reduction_order=reduction_order or "rank",
          device_cores=(cores.deal(n_islands, cores.available())
                        if pin else None),
          worker_timeout_s=(worker_timeout if worker_timeout is not None
                            else cfg.worker_timeout),
          restart_workers=restart_workers is not False,
          platform=platform or cfg.platform,
          compilation_cache_dir=_compilation_cache_dir(),
          storage_root=storage_root or cfg.storage_root or "/",
          # Its workers are this user's own processes.
          colocated_python=True)
      cluster.start()
      _cluster = cluster
      address, token = cluster.address, cluster.token
    elif (islands is not None or devices_per_island is not None or
          reduction_order is not None or pin_islands is not None or
          worker_timeout is not None or restart_workers is not None or
          platform is not None or storage_root is not None):
      raise ValueError("islands=, devices_per_island=, reduction_order=, "
                       "pin_islands=, worker_timeout=, restart_workers=, "
                       "platform= and storage_root= shape an embedded "
                       "cluster; a running controller has its own "
                       "(jax-pathways controller --reduction-order "
                       "--worker-timeout, jax-pathways worker --device-cores "
                       "--platform --storage-root)")
    _address = _normalize(address)
    _token = token or cfg.token
    plugin.configure(_token, wanted, controller_timeout,
                     before_connect=_check_late_settings)
    plugin.register()
    jax.config.update("jax_backend_target", _address)
    platforms = jax.config.jax_platforms or ""
    if not platforms:
      # JAX itself asks for 'cpu' (jax.devices('cpu'), values it keeps on
      # the host, e.g. a numpy input lax.scan passes straight through), so
      # it stays beside the cluster; listed first, the cluster's devices
      # are the default.
      jax.config.update("jax_platforms", f"{plugin.BACKEND_NAME},cpu")
    elif plugin.BACKEND_NAME not in platforms.split(","):
      jax.config.update("jax_platforms", plugin.BACKEND_NAME)
    if not _at_exit_registered:
      atexit.register(_at_exit)
      _at_exit_registered = True
    # Now, not when JAX starts the backend: JAX starts it inside the very
    # first jax.make_mesh call, too late to replace that call.
    make_mesh.install()
    if _cluster is None:
      _warn_if_compilation_cache()
      logging.info("jax_pathways: JAX runs on the controller at %s",
                   _address)
    else:
      logging.info("jax_pathways: embedded cluster at %s: %d islands x %d "
                   "%s devices; logs in %s (removed at exit unless "
                   "something failed)", _address, _cluster.islands,
                   _cluster.devices_per_island, _cluster.platform,
                   _cluster.log_dir)
    return _address


def _jax_compilation_cache() -> str | None:
  """JAX's persistent cache directory, if it is set and on."""
  import jax  # pylint: disable=import-outside-toplevel
  cache_dir = jax.config.jax_compilation_cache_dir
  if not cache_dir or not jax.config.jax_enable_compilation_cache:
    return None
  return cache_dir


def _compilation_cache_dir() -> str | None:
  """Where an embedded cluster's workers keep compiled programs: beside
  JAX's own persistent cache, which JAX skips through the proxy client (it
  cannot serialize executables). A local directory only."""
  cache_dir = _jax_compilation_cache()
  if cache_dir is None:
    return None
  if "://" in cache_dir:
    logging.warning("jax_pathways: JAX's compilation cache %s is not a "
                    "local directory; the workers keep compiled programs "
                    "for the controller's lifetime only", cache_dir)
    return None
  # Absolute: the workers run in the cluster's log directory.
  return os.path.abspath(os.path.join(os.path.expanduser(cache_dir),
                                      "jax_pathways"))


def _check_late_settings() -> None:
  """When JAX starts the backend (its first use): JAX settings made after
  initialize() that the cluster could not follow, said once."""
  cluster = _cluster
  if cluster is None:
    _warn_if_compilation_cache()
    return
  wanted = _compilation_cache_dir()
  if wanted != cluster.compilation_cache_dir:
    logging.warning(
        "jax_pathways: jax_compilation_cache_dir is %s now, but the embedded "
        "cluster's workers started with %s: it was set after "
        "jax_pathways.initialize(). Set it before initialize() (or export "
        "JAX_COMPILATION_CACHE_DIR) so that compiled programs are kept.",
        _jax_compilation_cache(), cluster.compilation_cache_dir or "none")


def _warn_if_compilation_cache() -> None:
  """JAX skips its persistent cache, without a word, for a backend that
  cannot serialize executables, as the proxy client cannot: say so once
  (a running cluster's workers keep their own, if they were told to)."""
  global _cache_warned
  cache_dir = _jax_compilation_cache()
  if _cache_warned or cache_dir is None:
    return
  _cache_warned = True
  logging.warning(
      "jax_pathways: JAX's persistent compilation cache (%s) is off through "
      "jax_pathways: the proxy client cannot serialize executables; the "
      "controller's workers keep compiled programs for its lifetime, or "
      "on disk if started with `jax-pathways worker "
      "--compilation-cache-dir`", cache_dir)


def _slice_request(devices: int | str | Sequence[int] | None,
                   island: int | None) -> dict[str, str]:
  """The slice request as the session's initialization data, checked."""
  wanted = {}
  if devices is not None:
    if isinstance(devices, int):
      devices = str(devices)
    elif not isinstance(devices, str):
      devices = "x".join(str(int(d)) for d in devices)
    wanted[session_keys.DEVICES_KEY] = devices
  if island is not None:
    wanted[session_keys.ISLAND_KEY] = str(island)
  try:
    SliceRequest.parse(wanted.get(session_keys.DEVICES_KEY),
                       wanted.get(session_keys.ISLAND_KEY))
  except StatusError as e:
    raise ValueError(f"jax_pathways.initialize: {e.status.message}") from None
  return wanted


def shutdown() -> None:
  """Stops what initialize() started. Arrays of the old backend are deleted
  (using one raises JAX's "Array has been deleted"); initialize() may then
  start over in this process, with a new cluster or controller."""
  global _cluster, _address, _shut_down
  with _lock:
    cluster, _cluster = _cluster, None
    if _address is None:
      return
    _address = None
    _shut_down = True
  plugin.close()
  # Let JAX drop its client first, so it disconnects while the controller is
  # still there.
  import jax  # pylint: disable=import-outside-toplevel
  from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
  _wait_for_ordered_effects()
  _delete_arrays(xla_bridge)
  # The client ends its session here unless the program still holds arrays
  # (then at exit, see plugin._quiet_session_end); it logs that end as a
  # warning with a stack trace.
  with (stderr_filter.Dropping("session_end") if plugin.connected
        else contextlib.nullcontext()) as dropping:
    jax.clear_caches()
    xla_bridge._clear_backends()  # pylint: disable=protected-access
    gc.collect()
    # Arrays or functions the program still holds keep the client, whose
    # session then ends as the controller stops: that end is logged too,
    # from the client's own thread, moments after.
    held = plugin.client_alive()
    if cluster is not None:
      cluster.stop()
      if dropping is not None and held:
        dropping.wait_until_dropped(_SESSION_END_WAIT_S)


def _wait_for_ordered_effects() -> None:
  """What JAX does at exit (dispatch.wait_for_tokens), now: ordered effects
  (`jax.debug.print(..., ordered=True)`) finish, and JAX lets go of their
  tokens, which would be deleted arrays by then (its exit hook raised on
  them)."""
  from jax._src import dispatch  # pylint: disable=import-outside-toplevel
  try:
    dispatch.runtime_tokens.block_until_ready()
  except Exception as e:  # pylint: disable=broad-except
    logging.warning("jax_pathways.shutdown: an ordered effect failed: %s", e)
  dispatch.runtime_tokens.clear()


def _delete_arrays(xla_bridge) -> None:
  """Deletes the proxy backend's live arrays. A client numbers its arrays
  from the same start each time, so an old array passed to the next
  backend's programs would silently name one of the new session's arrays."""
  if not xla_bridge.backends_are_initialized():
    return
  backend = xla_bridge.backends().get(plugin.BACKEND_NAME)
  if backend is None:
    return
  for array in backend.live_arrays():
    try:
      array.delete()
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("jax_pathways.shutdown: could not delete an array: %s",
                      e)


def _at_exit() -> None:
  # JAX's client still holds its session: let the controller go once that
  # closes (moments later, during interpreter teardown) instead of cutting it
  # off under live executables and arrays.
  global _cluster
  with _lock:
    cluster, _cluster = _cluster, None
  if cluster is not None:
    cluster.drain()


def connection() -> tuple[str, str | None]:
  """(address, token) of the controller this process runs on."""
  with _lock:
    if _address is None:
      raise RuntimeError("jax_pathways is not initialized; call "
                         "jax_pathways.initialize() first")
    return _address, _token


def local_cluster() -> LocalCluster | None:
  """The embedded cluster, if initialize() started one."""
  return _cluster
