"""The proxy client's flusher: a jaxlib thread that wakes every 50 µs, calmed.

jaxlib's IFRT proxy client (the backend plugin.py plugs in) batches array
deletions and sends them from a thread that sleeps 50 µs in a loop, for the
life of the process (xla/python/ifrt_proxy/client/rpc_helper.cc,
kPeriodicFlushInterval, a compile-time constant): about 9,000 wakes a second.
Each wake preempts whatever the core it lands on is computing. The client's
host computes too: with the embedded cluster its cores are the islands'
cores. Measured on the 2-core machine, an island whose core the client's
threads shared ran its pipeline launches up to 2x slower, and the wakes cost
the islands' threads ~2,000 preemptions a second (docs/benchmarks.md, B4).

After the client connects, `calm_new_threads` finds that thread among the ones
the connection started, by its wake rate, and lets the kernel batch its
wakes: a timer slack of 10 ms turns ~9,000 wakes a second into ~100. Batched
deletions still reach the controller before any later request (the client
flushes its batch before sending one); they free memory up to 10 ms later.
Changing another thread's slack needs CAP_SYS_NICE; without it the thread
gets the lowest priority (nice 19) instead, which stops it preempting
computation but not waking.
"""
from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Callable

from absl import logging

_TASKS = "/proc/self/task"
# A thread of the connection waking more often than this is the flusher
# (~9,000 a second); gRPC's own threads wake ~100 times a second.
FLUSHER_WAKES_PER_S = 2000
_SAMPLE_S = 0.05
_SAMPLES = 10  # at most 0.5 s in all, paid only where no flusher is found
SLACK_NS = 10_000_000

calmed: dict[int, str] = {}  # thread id -> what was done to it


def threads() -> set[int]:
  """Ids of this process's threads (empty where /proc is not Linux's)."""
  try:
    return {int(t) for t in os.listdir(_TASKS)}
  except OSError:
    return set()


def _wakes(tid: int) -> int | None:
  """How many times thread `tid` went to sleep and woke up so far."""
  with contextlib.suppress(OSError):
    with open(f"{_TASKS}/{tid}/status", encoding="ascii") as f:
      for line in f:
        if line.startswith("voluntary_ctxt_switches:"):
          return int(line.split()[1])
  return None


def wake_rates(tids: set[int], seconds: float = _SAMPLE_S) -> dict[int, float]:
  """Wakes per second of each thread in `tids` still alive, over `seconds`."""
  before = {t: _wakes(t) for t in tids}
  time.sleep(seconds)
  rates = {}
  for t, w0 in before.items():
    w1 = _wakes(t)
    if w0 is not None and w1 is not None:
      rates[t] = (w1 - w0) / seconds
  return rates


def _calm(tid: int) -> str:
  with contextlib.suppress(OSError):
    with open(f"/proc/{tid}/timerslack_ns", "w", encoding="ascii") as f:
      f.write(str(SLACK_NS))
    return f"timer slack {SLACK_NS // 1_000_000} ms"
  try:
    os.setpriority(os.PRIO_PROCESS, tid, 19)
    return "nice 19 (no CAP_SYS_NICE for a timer slack)"
  except OSError as e:
    return f"left as it is ({e})"


def calm_new_threads(connect: Callable[[], Any]) -> Any:
  """Returns connect(); calms the threads it started that wake too often.
  Sampled again while none does, up to _SAMPLES times: on a loaded machine
  the flusher may hardly run in one sample (a CI run missed it once)."""
  before = threads()
  client = connect()
  started = threads() - before
  for _ in range(_SAMPLES):
    for tid, rate in wake_rates(started).items():
      if rate > FLUSHER_WAKES_PER_S and tid not in calmed:
        calmed[tid] = _calm(tid)
        logging.info("jax_pathways: jaxlib's proxy client thread %d wakes "
                     "%.0f times a second; %s", tid, rate, calmed[tid])
    if started & calmed.keys():
      break
  return client
