"""A controller WITHOUT gang order, for B7 only: per-worker FIFOs fed by
independent clients.

    python benchmarks/naive_fifo.py controller --islands 2 ...  (the CLI's
    arguments)

This is what a runtime without a single controller does: every client
sends its work to each worker over its own connection, in its own order,
and each worker runs what arrives first. Here every gang is split into its
islands' parts; each island has a delivery thread that takes the next part
of a client chosen at random, so one client's ops reach each worker in that
client's order, but two clients' ops may reach two workers in different
orders. Programs whose collectives span workers then pair up wrongly or
wait on each other forever. It exists to show what jax_pathways prevents;
nothing in the package uses it.
"""
from __future__ import annotations

import collections
import random
import sys
import threading
import time
from typing import Sequence

from jax_pathways import cli
from jax_pathways.controller import controller as controller_module
from jax_pathways.controller.dispatcher import Dispatcher, IslandOp, OnDone
from jax_pathways.status import Status

class NaiveDispatcher(Dispatcher):
  """Islands receive each client's ops in order, clients interleaved at
  random, independently on every island."""

  in_order = False  # no C++ fast path submitting beside it

  def __init__(self, max_in_flight: int, memory_wait_s: float,
               worker_timeout_s: float):
    super().__init__(max_in_flight, memory_wait_s, worker_timeout_s)
    self._mu = threading.Condition()
    # island -> client -> parts waiting, in the client's order
    self._queues: dict[int, dict[int, collections.deque]] = (
        collections.defaultdict(lambda: collections.defaultdict(
            collections.deque)))
    self._rng = random.Random(0)
    self._delivering: dict[int, threading.Thread] = {}

  def submit(self, gang: Sequence[IslandOp], on_done: OnDone | None = None,
             client: int = 0) -> None:
    parts = list(gang)
    done = _Joined(len(parts), on_done)
    with self._mu:
      for index, op in enumerate(parts):
        self._queues[op.island][client].append((op, index, done))
        if op.island not in self._delivering:
          self._delivering[op.island] = threading.Thread(
              target=self._deliver, args=(op.island,), daemon=True)
          self._delivering[op.island].start()
      self._mu.notify_all()

  def _deliver(self, island: int) -> None:
    while True:
      with self._mu:
        self._mu.wait_for(lambda: any(self._queues[island].values()))
        clients = [c for c, q in self._queues[island].items() if q]
        client = self._rng.choice(clients)
        op, index, done = self._queues[island][client].popleft()
      super().submit([op], lambda s, p, i=index, d=done: d.part(i, s, p),
                     client)
      time.sleep(self._rng.random() * 2e-4)  # the network's say in it


class _Joined:
  """Calls on_done once every part of a split gang has finished."""

  def __init__(self, parts: int, on_done: OnDone | None):
    self._left = parts
    self._status = Status()
    self._payloads: list[bytes] = [b""] * parts
    self._on_done = on_done
    self._mu = threading.Lock()

  def part(self, index: int, status: Status, payloads: list[bytes]) -> None:
    with self._mu:
      if not status.ok and self._status.ok:
        self._status = status
      self._payloads[index] = payloads[0] if payloads else b""
      self._left -= 1
      last = self._left == 0
    if last and self._on_done is not None:
      self._on_done(self._status, self._payloads)


if __name__ == "__main__":
  controller_module.Dispatcher = NaiveDispatcher
  sys.exit(cli.main(sys.argv[1:]))
