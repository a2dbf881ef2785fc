"""When a dead worker is started again: the policy the embedded cluster's
supervisor (local_cluster.py) and a pod's (`jax-pathways worker
--restart-in-place`, worker/in_place.py) share.

Deaths soon after a start (within QUICK_DEATH_S) in a row are one incident:
the k-th waits RESTART_DELAYS_S[k] (the last one from then on) before the
next start, and the incident is given up on after MAX_QUICK_RESTARTS. A
worker that lived longer starts a new incident, so a long run is never
given up on for crashes hours apart.
"""
from __future__ import annotations

QUICK_DEATH_S = 60.0
RESTART_DELAYS_S = (0.0, 1.0, 2.0, 4.0, 8.0)
MAX_QUICK_RESTARTS = 5


class Incident:
  """One worker's quick deaths in a row. The limits are read at each death,
  so tests may set this module's values."""

  def __init__(self) -> None:
    self.deaths = 0

  def died(self, lived_s: float) -> float | None:
    """Counts a death after `lived_s` seconds; returns the delay before the
    next start, or None: give up."""
    self.deaths = self.deaths + 1 if lived_s < QUICK_DEATH_S else 1
    if self.deaths > MAX_QUICK_RESTARTS:
      return None
    return RESTART_DELAYS_S[min(self.deaths, len(RESTART_DELAYS_S)) - 1]

  def describe(self) -> str:
    """Why the incident was given up on, for a log line or status."""
    return (f"{self.deaths} times in a row within {QUICK_DEATH_S:.0f} s of "
            "starting")

  def reset(self) -> None:
    """A start on request (its cause fixed) begins a new incident."""
    self.deaths = 0
