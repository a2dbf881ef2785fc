"""Islands: which of a cluster's islands can run work now, and their devices.

The controller's status is the source of truth: an island is up while its
worker is alive; a lost island is up again once a new worker has taken its
place (its generation grows by one) and finished joining.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable

import jax
from absl import logging

from jax_pathways import _initialize, admin

# Seconds between looks at the controller while waiting for islands.
POLL_S = 0.05
# Seconds a loss may reach the client before the controller has seen it: a
# program spanning islands fails in gloo as soon as a peer worker dies, and
# the controller sees the death (its connection closing) about then too.
NOTICE_S = 5.0


def _status() -> dict[str, Any]:
  address, token = _initialize.connection()
  return admin.status(address, token, timeout=5.0)


def up() -> frozenset[int]:
  """The islands whose worker is alive now (as the controller sees it)."""
  try:
    status = _status()
  except admin.AdminError as e:
    logging.warning("elastic: cannot ask the controller which islands are "
                    "up (%s)", e)
    return frozenset()
  # A worker taking a lost island's place is up once it is no longer
  # joining: by then its island's part of the global client is on its way.
  return frozenset(int(i["island"]) for i in status["islands"]
                   if i["alive"] and not i.get("joining", False))


def given_up(islands: Iterable[int]) -> str:
  """Why a supervisor stopped restarting the worker of each of `islands`
  it gave up on, with what to do ("island N: ..." lines; "" if none)."""
  try:
    status = _status()
  except admin.AdminError:
    return ""
  keep = frozenset(islands)
  return "\n".join(
      f"island {i['island']}: its supervisor gave up: "
      f"{i['supervisor']['given_up']}" for i in status["islands"]
      if i["island"] in keep and (i.get("supervisor") or {}).get("given_up"))


def wait(enough: Callable[[frozenset[int]], bool],
         timeout: float) -> frozenset[int]:
  """The up islands once `enough` of them are, or when `timeout` has
  passed."""
  deadline = time.monotonic() + timeout
  while True:
    alive = up()
    if enough(alive) or time.monotonic() >= deadline:
      return alive
    time.sleep(POLL_S)


def devices(islands: Iterable[int]) -> list[jax.Device]:
  """The devices of `islands`, island by island, in JAX's device order."""
  keep = frozenset(islands)
  return [d for d in jax.devices() if d.slice_index in keep]


def all_islands() -> tuple[int, ...]:
  """Every island of the cluster, as JAX's devices name them."""
  return tuple(sorted({d.slice_index for d in jax.devices()}))
