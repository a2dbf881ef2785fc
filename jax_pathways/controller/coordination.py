"""Coordination: the service behind the islands' global client.

When a cluster has several islands, every worker also joins one multi-process
PJRT client (jaxlib's distributed CPU client, collectives over gloo) so that a
program can span islands. Its coordination service runs beside the
controller, in a child process (coordination_host.py), so that no worker's
death takes it down and a dead controller's workers leave on their own
before it goes; it is "recoverable": a worker that dies does not bring the
others down with it.

The global client has generations, each over the islands whose workers are
up (its members). Every member's worker builds a generation in the
background, told by a JOIN_GLOBAL op in its gang order (ahead of whatever
is launched next), and the op's completion says whether it was built.
Generation 0 starts once every island's worker is up. When the islands up
change -- one is lost and a program spans the others, or a lost island's
place is taken -- the controller starts a fresh service (its key-value store
holds nothing of the old topology exchange or gloo rendezvous) and the
members build generation g+1 at it. Old services stay
up: a survivor's old distributed client still heartbeats to its service, and
jaxlib 0.10.2 aborts the process once those heartbeats fail (measured:
shutting a service down killed its client with SIGABRT within seconds).
"""
from __future__ import annotations

import contextlib
import json
import select
import socket
import subprocess
import sys
import threading
from typing import Any, Callable, Sequence

from absl import logging

from jax_pathways.cluster import addresses
from jax_pathways.controller import coordination_host
from jax_pathways.resources.island import Island
from jax_pathways.status import Code, Status, StatusError, unavailable

# How long the services' process may take to start one (it imports jaxlib
# first, while the workers start).
SERVE_TIMEOUT_S = 60.0


def _free_port(host: str) -> int:
  with socket.create_server((host, 0)) as s:
    return s.getsockname()[1]


def _concrete(address: str) -> str:
  """`address`, with a free port if it asks for any (port 0): a service
  needs one its workers can be told."""
  if not addresses.is_unix(address):
    host, _, port = address.rpartition(":")
    if port == "0":
      return f"{host}:{_free_port(host.strip('[]'))}"
  return address


class CoordinationHost:
  """The child process holding the services (coordination_host.py): a
  stopped or dead controller's workers leave before their services go.
  Thread-safe."""

  def __init__(self):
    self._lock = threading.Lock()
    # Started now: it imports jaxlib while the workers start.
    self._proc = subprocess.Popen(
        [sys.executable, "-m", "jax_pathways.controller.coordination_host"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

  def serve(self, address: str, islands: int) -> None:
    """Starts a service for `islands` workers at `address`; raises
    StatusError (UNAVAILABLE) if it could not."""
    with self._lock:
      try:
        self._proc.stdin.write(json.dumps({"address": address,
                                           "islands": islands}) + "\n")
        self._proc.stdin.flush()
        ready, _, _ = select.select([self._proc.stdout], [], [],
                                    SERVE_TIMEOUT_S)
        answer = json.loads(self._proc.stdout.readline() if ready else "{}")
      except (OSError, ValueError) as e:
        answer = {"error": f"its process is gone ({e})"}
    if "ready" not in answer:
      raise unavailable(
          f"could not start the islands' coordination service at {address}: "
          f"{answer.get('error', f'no answer within {SERVE_TIMEOUT_S:.0f} s')}")
    logging.info("coordination service for %d islands at %s", islands,
                 address)

  def close(self) -> None:
    with self._lock, contextlib.suppress(OSError, ValueError):
      self._proc.stdin.write(json.dumps({"exit": True}) + "\n")
      self._proc.stdin.close()
    try:
      # It goes once the workers have (told to stop by now, they leave).
      self._proc.wait(timeout=coordination_host.LINGER_S + 5)
    except subprocess.TimeoutExpired:
      self._proc.kill()
      self._proc.wait()


class GlobalClient:
  """The islands' global client, one generation after another; thread-safe.

  A generation is built by the workers of certain island generations (its
  members); a program spanning islands runs only where all of its islands'
  current workers are members of the current generation.

  up() -> island -> island generation, for the islands whose worker is up;
  build(generation, address, members) sends the members' workers the
  JOIN_GLOBAL op (and calls finished() once they are done)."""

  WAITING, JOINING, READY, FAILED = "waiting", "joining", "ready", "failed"
  # READY once, but a member's worker is lost since (status only).
  BROKEN = "broken"

  def __init__(self, islands: int, listen: str,
               up: Callable[[], dict[int, int]],
               build: Callable[[int, str, tuple[int, ...]], None]):
    self._islands = islands
    self._listen = listen
    self._up = up
    self._build = build
    # Reentrant: build() may report a failure at once (finished()).
    self._lock = threading.RLock()
    self._host = CoordinationHost()
    # Each generation's service address (the first one's service is
    # started with generation 0, once every island is up).
    self._services = [_concrete(listen)]
    self.generation = 0
    # Island -> the island generation whose worker is in the global client
    # (none until every island's worker is up: WAITING).
    self._members: dict[int, int] = {}
    self._state = self.WAITING
    self._error = ""

  def follow(self) -> dict[int, int]:
    """Starts generation 0 once every island is up, and later the next
    generation if the islands up are not the current one's members (at
    least two: one island needs no global client). Returns the islands
    up."""
    members = self._up()
    with self._lock:
      if members == self._members or len(members) < 2:
        return members
      if not self._members:
        if len(members) < self._islands:
          return members
        # The first: its service, made for every island, is still unused.
      else:
        self._services.append(_concrete(self._next_address()))
        self.generation += 1
      self._members = dict(members)
      generation, address = self.generation, self._services[-1]
      try:
        self._host.serve(address, len(members))
      except StatusError as e:
        logging.error("global client generation %d: %s", generation,
                      e.status.message)
        self._state, self._error = self.FAILED, e.status.message
        return members
      self._state, self._error = self.JOINING, ""
      # Under the lock: a launch checked after this is numbered after the
      # JOIN_GLOBAL ops on every island.
      self._build(generation, address, tuple(sorted(members)))
    return members

  def _next_address(self) -> str:
    """A fresh address for the next service, like the first one."""
    if addresses.is_unix(self._listen):
      return f"{self._listen}.{len(self._services)}"
    host, _, _ = self._services[0].rpartition(":")
    return f"{host}:0"

  def finished(self, generation: int, status: Status) -> None:
    """Generation `generation`'s workers have built it (or failed to)."""
    with self._lock:
      if generation != self.generation:
        return  # a newer one was started meanwhile
      if status.ok:
        self._state = self.READY
      else:
        self._state, self._error = self.FAILED, status.message
    if status.ok:
      logging.info("the islands' global client generation %d is built",
                   generation)
    else:
      logging.error("the islands' global client generation %d could not be "
                    "built: %s", generation, status.message)

  def check(self, islands: Sequence[Island]) -> int | None:
    """The generation a program spanning `islands` (their current workers)
    runs on (None: one of them is lost, and fails the program with its
    loss); raises why it cannot run. A generation still being built is
    fine: the workers order its JOIN_GLOBAL before anything launched now,
    and wait for it (bounded) before they compile for it."""
    up = self.follow()
    with self._lock:
      if any(i.id not in up for i in islands):
        return None
      if not self._members:
        raise StatusError(
            Code.UNAVAILABLE,
            f"the islands' global client is built once all "
            f"{self._islands} islands' workers are up (up: "
            f"{sorted(up)}); run it again then")
      outside = [i for i in islands if self._members.get(i.id) != i.generation]
      if outside:
        raise spanning_refused(outside)
      if self._state == self.FAILED:
        raise StatusError(
            Code.UNAVAILABLE,
            f"the islands' global client (generation {self.generation}) "
            f"could not be built: {self._error}; it is built again when "
            "the islands up next change (an island lost or rejoined)")
      return self.generation

  def member(self, island: Island) -> bool:
    """Whether `island`'s current worker is in the current generation,
    built, with every other member still up."""
    up = self._up()
    with self._lock:
      return (self._state == self.READY and
              self._members.get(island.id) == island.generation and
              all(up.get(i) == g for i, g in self._members.items()))

  def describe(self) -> dict[str, Any]:
    up = self._up()
    with self._lock:
      state, error = self._state, self._error
      lost = sorted(i for i, g in self._members.items() if up.get(i) != g)
      if state == self.READY and lost:
        state = self.BROKEN
        error = (f"the worker of island(s) {lost} is lost; programs spanning "
                 "islands fail until it is replaced (then it is built anew)")
      return {"generation": self.generation, "state": state, "error": error,
              "address": self._services[-1]}

  def shutdown(self) -> None:
    self._host.close()


def spanning_refused(islands: Sequence[Island]) -> StatusError:
  """Why a program spanning `islands` (workers not in the global client)
  cannot run yet."""
  names = ", ".join(f"island {i.id} (generation {i.generation})"
                    for i in islands)
  return StatusError(
      Code.FAILED_PRECONDITION,
      f"the program spans islands, but the worker of {names} is not in the "
      "islands' global client: it changed workers while the program was "
      "checked; run it again")
