"""RunBounds: taking an island back from a program that holds it too long.

Nothing stops a program XLA runs: a `lax.while_loop` whose condition stays
true runs for ever, and every op queued behind it on its island waits. The
one way to take the island back is its worker: the controller drops it
(`Dispatcher.fail_island`; the island's work fails with the reason below),
the worker exits (worker/join.py, also from inside the program), and its
supervisor (the embedded cluster, k8s, Ray, `--restart-in-place`) starts
another in its place within seconds. Every client's arrays on the island
are lost with it, so this is done only to

- a program that has held its island past the owner's bound
  (`jax-pathways controller --max-program-seconds`; none by default),
- a program whose client has left (ended its session or died) while
  others' work waits behind it, LEFT_GRACE_S after it left
  (one that holds an island nobody else needs costs nobody their arrays),
- a program of a client an operator cancelled (`jax-pathways cancel`), at
  once.

What runs on an island is the dispatcher's record: its oldest unfinished
launch, and for how long it has had the island (`stats()`'s running_*).
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from absl import logging

from jax_pathways import threads
from jax_pathways.controller.dispatcher import Dispatcher
from jax_pathways.status import Code, Status

# How often the islands' running launches are looked at.
POLL_S = 0.5
# A program of a client that left may still finish on its own this long.
LEFT_GRACE_S = 5.0


class RunBounds:
  """The watch over every island's running launch."""

  def __init__(self, dispatcher: Dispatcher, max_program_s: float | None,
               live_clients: Callable[[], set[int]],
               program_name: Callable[[int], str],
               calling_back: Callable[[int], bool]):
    """live_clients(): the numbers of the clients whose sessions have not
    ended. program_name(id): a compiled program's name, for the error.
    calling_back(client): whether a program of that client waits in one of
    its host callbacks (said in the error: the likely cause)."""
    self._dispatcher = dispatcher
    self.max_program_s = max_program_s or None
    self._live_clients = live_clients
    self._program_name = program_name
    self._calling_back = calling_back
    self._lock = threading.Lock()
    # Clients an operator cancelled (numbers), and when each client whose
    # launch runs was first seen gone.
    self._cancelled: set[int] = set()
    self._left_at: dict[int, float] = {}
    self._wake = threading.Event()
    self._stopped = False
    self._thread: threading.Thread | None = None

  def start(self) -> None:
    self._thread = threads.start(self._run, "jp-run-bounds")

  def stop(self) -> None:
    self._stopped = True
    self._wake.set()
    if self._thread is not None:
      self._thread.join(timeout=10)

  def cancel(self, client: int) -> None:
    """An operator ended `client`: islands running its programs are taken
    back at once."""
    with self._lock:
      self._cancelled.add(client)
    self.check()

  def _run(self) -> None:
    while not self._stopped:
      self._wake.wait(POLL_S)
      self._wake.clear()
      try:
        self.check()
      except Exception:  # pylint: disable=broad-except
        logging.exception("run bounds: checking the islands failed")

  def check(self) -> None:
    """Takes back every island whose running launch must end."""
    now = time.monotonic()
    live = self._live_clients()
    running: set[int] = set()
    for s in self._dispatcher.stats():
      client = s["running_client"]
      if not s["alive"] or not client:
        continue
      running.add(client)
      why = self._why(client, s["running_s"], s["others_waiting"] > 0, live,
                      now)
      if why:
        self._take_back(s, why)
    with self._lock:
      # Forget who left once nothing of theirs runs.
      for client in set(self._left_at) - running:
        del self._left_at[client]
      self._cancelled &= running | live

  def _why(self, client: int, seconds: float, others_wait: bool,
           live: set[int], now: float) -> str:
    """Why the island running `client`'s launch for `seconds` (others'
    work waiting behind it or not) must be taken back ("" if it may go
    on)."""
    with self._lock:
      if client in self._cancelled:
        return "an operator cancelled its client (jax-pathways cancel)"
      if client not in live:
        left = self._left_at.setdefault(client, now)
        if others_wait and now - left >= LEFT_GRACE_S:
          return (f"its client left {now - left:.0f} s before and the "
                  "program still ran, other clients' work waiting behind it")
    bound = self.max_program_s
    if bound is not None and seconds > bound:
      return (f"it ran past the cluster's bound of {bound:g} s on a "
              "program's run time (the controller's --max-program-seconds)")
    return ""

  def _take_back(self, stats: dict, why: str) -> None:
    name = self._program_name(stats["running_program"])
    client = stats["running_client"]
    if self._calling_back(client):
      why += (" (it waited in a host callback of its client: a callback "
              "that runs a program of several devices on the island of the "
              "program that called it waits for ever, as in plain JAX)")
    message = (
        f"island {stats['island']} was taken back from program '{name}' of "
        f"client {client}, which had held it for {stats['running_s']:.1f} "
        f"s: {why}. Its worker ({stats['name']}) was dropped (its "
        "supervisor starts another in its place) and every array on the "
        "island was lost")
    logging.warning("%s", message)
    self._dispatcher.fail_island(stats["island"],
                                 Status(Code.DATA_LOSS, message))
