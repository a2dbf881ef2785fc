"""Compiled programs live as long as a client holds them: once JAX drops
its executables (jax.clear_caches(), or the jitted functions gone), the
controller releases them and their workers free the compiled code. Each
XLA:CPU program holds ~3 memory mappings, of which Linux gives a process
65,530: a worker that kept every program it compiled died of it in a long
test suite."""
import gc
import os
import time

import jax
import numpy as np
import pytest

from jax_pathways.controller import compile_cache

PROGRAMS = 400


def _mappings(pid: int) -> int:
  with open(f"/proc/{pid}/maps", encoding="utf-8") as f:
    return sum(1 for _ in f)


def _distinct_programs(device, count: int) -> list:
  """`count` programs that differ only in a constant, each run once and
  checked; their jitted functions (while they live, so do the programs)."""
  x = jax.device_put(np.arange(8, dtype=np.float32), device)
  functions = []
  for i in range(count):
    functions.append(jax.jit(lambda a, i=i: a * np.float32(i) + 1))
    np.testing.assert_array_equal(
        np.asarray(functions[-1](x)), np.arange(8, dtype=np.float32) * i + 1)
  return functions


def _wait_until(predicate, timeout: float = 60.0) -> bool:
  """Polls `predicate` until it holds; False after `timeout` (a hang)."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if predicate():
      return True
    time.sleep(0.2)
  return predicate()


def test_programs_dropped_by_jax_are_freed_on_their_worker(pathways,
                                                           proxy_devices):
  worker = pathways.workers[0].pid  # island 0's: proxy_devices[0]
  _distinct_programs(proxy_devices[0], 8)  # whatever a first program maps
  jax.clear_caches()
  gc.collect()
  start = _mappings(worker)

  functions = _distinct_programs(proxy_devices[0], PROGRAMS)
  grown = _mappings(worker)
  # The test can fail: the programs were all there at once.
  assert grown > start + PROGRAMS, (start, grown)

  del functions
  jax.clear_caches()
  gc.collect()
  # Freed once the client's destructs arrive (jaxlib sends them batched);
  # the controller keeps a few unheld programs for a re-jit.
  bound = start * 1.1
  assert compile_cache.KEEP_UNHELD * 3 < start * 0.1
  assert _wait_until(lambda: _mappings(worker) <= bound), (
      start, grown, _mappings(worker))
  print(f"worker mappings: {start} at the start, {grown} with {PROGRAMS} "
        f"programs, {_mappings(worker)} once JAX dropped them")


def test_a_program_released_while_its_launches_wait_still_runs_them(
    pathways, proxy_devices):
  """Released with launches still queued behind a saturated island, a
  program runs them all before its worker frees it."""
  x = jax.device_put(np.ones((64, 64), np.float32), proxy_devices[0])
  outs = []
  for i in range(48):  # distinct programs: each is freed on release
    f = jax.jit(lambda a, i=i: (a @ a) * np.float32(i))
    outs.append((i, f(x)))
    del f
  jax.clear_caches()
  gc.collect()
  for i, out in outs:
    np.testing.assert_array_equal(np.asarray(out),
                                  np.full((64, 64), 64.0 * i, np.float32))


@pytest.mark.slow
def test_a_long_stream_of_distinct_programs_keeps_the_worker_flat(
    pathways, proxy_devices):
  """30,000 distinct programs ($JAX_PATHWAYS_SOAK_PROGRAMS), dropped 400 at
  a time as a long job's retracing drops them: no worker lost, its
  mappings flat (without freeing, ~21,600 programs reach the kernel's
  limit)."""
  worker = pathways.workers[0].pid
  rounds = int(os.environ.get("JAX_PATHWAYS_SOAK_PROGRAMS", "30000")) // (
      PROGRAMS)
  start = None
  for _ in range(rounds):
    _distinct_programs(proxy_devices[0], PROGRAMS)
    jax.clear_caches()
    gc.collect()
    if start is None:
      start = _mappings(worker)
  assert _wait_until(lambda: _mappings(worker) <= start * 1.1)
  assert pathways.workers[0].poll() is None
  print(f"{rounds * PROGRAMS} programs: worker mappings {start} after the "
        f"first {PROGRAMS}, {_mappings(worker)} at the end")
