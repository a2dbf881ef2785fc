"""ControllerWatch: a controller that stops answering ends this process's
JAX backend within a bound, with an error, instead of leaving calls waiting.

jaxlib's IFRT-proxy client has no deadline: a reply it waits for from a
stopped (SIGSTOP), wedged or unreachable controller never comes while the
connection stays open. The watch pings the controller every second on a
channel of its own; after `timeout_s` without an answer it logs what
happened and what to do, then shuts down this process's connections to the
controller's address, and keeps cutting new ones for as long as the
process lives: this process is done with that controller. jaxlib then
fails every waiting and later call with `JaxRuntimeError: UNAVAILABLE:
Connection to IFRT proxy server was terminated`, as when the controller
dies (no abort; measured with jaxlib 0.10.2). A shutdown reaches the socket every descriptor shares, so gRPC's
own descriptors see it; only the duplicates made here are closed.
"""
from __future__ import annotations

import threading
import time

import grpc
from absl import logging

from jax_pathways import threads
from jax_pathways.cluster import addresses
from jax_pathways.wire.session_keys import ADMIN_PING

PERIOD_S = 1.0
CUT_PERIOD_S = 0.1  # after giving up: how often new connections are cut

_watch: "ControllerWatch | None" = None


class ControllerWatch:
  """Pings `target` (grpc://host:port or grpc://unix:path) until stop()."""

  def __init__(self, target: str, timeout_s: float):
    self.target = target
    self.timeout_s = timeout_s
    self.gave_up = threading.Event()
    self._stopped = threading.Event()
    self._channel = grpc.insecure_channel(addresses.dial_target(target))
    self._ping = self._channel.unary_unary(ADMIN_PING)

  def start(self) -> None:
    threads.start(self._run, "jp-watch")

  def stop(self) -> None:
    self._stopped.set()

  def _run(self) -> None:
    answered = time.monotonic()
    while not self._stopped.wait(PERIOD_S):
      try:
        self._ping(b"", timeout=min(self.timeout_s, 5.0))
        answered = time.monotonic()
      except grpc.RpcError as e:
        # Any answer, even an error, is the controller's: it lives.
        if e.code() not in (grpc.StatusCode.UNAVAILABLE,
                            grpc.StatusCode.DEADLINE_EXCEEDED):
          answered = time.monotonic()
      silent = time.monotonic() - answered
      if silent >= self.timeout_s and not self._stopped.is_set():
        self._give_up(silent)
        # jaxlib's client opens new connections for uploads in the
        # background (GrpcClientHostBufferStore), whose calls would wait
        # out their deadline (20 s, at exit too): cut those as well.
        while not self._stopped.wait(CUT_PERIOD_S):
          shut_down_connections(self.target)
        return

  def _give_up(self, silent: float) -> None:
    logging.error(
        "jax_pathways: the controller at %s has not answered for %.0f s "
        "(stopped, wedged or unreachable); this process's JAX calls now fail "
        "with UNAVAILABLE and its arrays on the cluster are lost. Restart the "
        "process once the controller serves again (`jax-pathways status`); "
        "allow longer pauses with JAX_PATHWAYS_CONTROLLER_TIMEOUT (0: wait "
        "forever)", self.target, silent)
    self.gave_up.set()
    self._channel.close()
    closed = shut_down_connections(self.target)
    logging.info("jax_pathways: shut down %d connection(s) to %s", closed,
                 self.target)


def _peers(target: str) -> set[object]:
  """The socket addresses `target` names, as getpeername() reports them."""
  address = addresses.dial_target(target)
  if addresses.is_unix(address):
    path = address[len(addresses.UNIX):]
    return {path, path.encode()}
  try:
    return addresses.endpoints(address)
  except (OSError, ValueError):
    return set()


def shut_down_connections(target: str) -> int:
  """Shuts down every socket of this process connected to `target`;
  returns how many."""
  return addresses.shut_down_connected(_peers(target))


def start(target: str, timeout_s: float) -> None:
  """Watches `target` for this process (timeout_s 0: never gives up)."""
  global _watch
  stop()
  if timeout_s > 0:
    _watch = ControllerWatch(target, timeout_s)
    _watch.start()


def stop() -> None:
  global _watch
  if _watch is not None:
    _watch.stop()
    _watch = None
