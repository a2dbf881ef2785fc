"""A training client under pathwaysutils' elastic Manager, against an
embedded cluster of its own (or the one at --address) whose island-1 worker
it kills or stops.

Written as pathwaysutils' users write theirs: `pathwaysutils.initialize()`
at the top, the training function decorated with
`Manager().elastic_retry(...)`; each attempt builds its mesh from the slices
the manager found active and resumes from the last good state kept every
--save-every steps (numpy in host memory, or an Orbax checkpoint). It trains
twice: uninterrupted (the reference), then with the fault injected before
step --fault-at.

Prints JSON lines: {"pids"} (the cluster's; again in "elastic" and
"attempt"), {"fault"}, {"elastic"} (each error the retry caught),
{"attempt"}, {"resumed"} (the first step of a retried attempt read back),
then {"done"} with both runs' losses, parameters and attempts, or
{"failed"} with what the user saw.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
from typing import Any, Callable

import jax_pathways

ARGS = argparse.ArgumentParser()
ARGS.add_argument("--fault", choices=["kill", "stop"], required=True)
ARGS.add_argument("--fault-at", type=int, required=True)
ARGS.add_argument("--mesh", choices=["one", "all"], required=True,
                  help="one: the devices of the last active slice (island 1 "
                  "while it is there); all: those of every active slice")
ARGS.add_argument("--min-slices", type=int, default=None,
                  help="elastic_retry(minimum_slice_count=); default: all")
ARGS.add_argument("--store", choices=["host", "orbax"], default="host")
ARGS.add_argument("--steps", type=int, default=24)
ARGS.add_argument("--save-every", type=int, default=4)
ARGS.add_argument("--devices-per-island", type=int, default=2)
ARGS.add_argument("--worker-timeout", type=float, default=None)
ARGS.add_argument("--address", help="a running cluster's controller")
ARGS.add_argument("--token", help="its token")
FLAGS = ARGS.parse_args()

if FLAGS.address:
  jax_pathways.initialize(FLAGS.address, token=FLAGS.token)
else:
  jax_pathways.initialize(islands=2,
                          devices_per_island=FLAGS.devices_per_island,
                          worker_timeout=FLAGS.worker_timeout)

# What Pathways-on-Cloud users call first. After jax_pathways.initialize()
# it sees JAX_PLATFORMS=proxy and applies everything: its own 'proxy'
# backend factory (JAX's plugin discovery puts jax_pathways' back), its
# profiler patches, no compilation cache.
import pathwaysutils  # noqa: E402

pathwaysutils.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402
from pathwaysutils.elastic import manager as elastic_manager  # noqa: E402

from jax_pathways import admin  # noqa: E402

VICTIM_ISLAND = 1
BATCH, IN, HIDDEN = 32, 16, 32  # BATCH divides by every mesh size used
TX = optax.sgd(0.05, momentum=0.9)
TARGET = (np.random.default_rng(7).normal(size=(IN, 1)) / np.sqrt(IN)
          ).astype(np.float32)


def say(**kw: Any) -> None:
  print(json.dumps(kw), flush=True)


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
  """The data of `step`, the same in every attempt."""
  x = np.random.default_rng(step).normal(size=(BATCH, IN)).astype(np.float32)
  return x, np.tanh(x @ TARGET * 2.0)


def initial_state() -> dict[str, Any]:
  rng = np.random.default_rng(1234)
  params = {
      "w1": (rng.normal(size=(IN, HIDDEN)) / np.sqrt(IN)).astype(np.float32),
      "b1": np.zeros(HIDDEN, np.float32),
      "w2": (rng.normal(size=(HIDDEN, 1)) / np.sqrt(HIDDEN)).astype(np.float32),
      "b2": np.zeros(1, np.float32),
  }
  return {"params": params, "opt": jax.device_get(TX.init(params))}


@jax.jit
def train_step(state: dict[str, Any], x: jax.Array, y: jax.Array
               ) -> tuple[dict[str, Any], jax.Array]:
  def loss_fn(p: dict[str, jax.Array]) -> jax.Array:
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

  loss, grads = jax.value_and_grad(loss_fn)(state["params"])
  updates, opt = TX.update(grads, state["opt"], state["params"])
  return {"params": optax.apply_updates(state["params"], updates),
          "opt": opt}, loss


class HostStore:
  """The last good state as numpy in this process's memory."""

  def __init__(self) -> None:
    self.step, self.state = 0, initial_state()

  def save(self, step: int, state: dict[str, Any]) -> None:
    self.state, self.step = jax.device_get(state), step

  def restore(self, replicated: NamedSharding) -> tuple[int, dict[str, Any]]:
    return self.step, jax.device_put(self.state, replicated)


class OrbaxStore:
  """The last good state as Orbax checkpoints in a directory, restored onto
  whatever mesh the attempt has."""

  def __init__(self, directory: str) -> None:
    self.manager = ocp.CheckpointManager(directory)
    self.save(0, initial_state())

  def save(self, step: int, state: dict[str, Any]) -> None:
    self.manager.save(step, args=ocp.args.StandardSave(state))
    # Only a finished checkpoint is a good state.
    self.manager.wait_until_finished()

  def restore(self, replicated: NamedSharding) -> tuple[int, dict[str, Any]]:
    step = self.manager.latest_step()
    abstract = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated),
        initial_state())
    return step, self.manager.restore(
        step, args=ocp.args.StandardRestore(abstract))


def pids() -> list[int]:
  """The embedded cluster's processes (the test stops those left); a
  cluster joined by address is its starter's to stop."""
  cluster = jax_pathways.local_cluster()
  return cluster.pids if cluster is not None else []


def islands() -> list[dict[str, Any]]:
  """The controller's view of the islands (pid, restarts, ...)."""
  return admin.status(*jax_pathways.connection())["islands"]


def train(inject: Callable[[], None] | None) -> dict[str, Any]:
  """One elastic training run; `inject`, if any, is called once, before
  step FLAGS.fault_at of the first attempt."""
  manager = elastic_manager.Manager()
  store = (OrbaxStore(tempfile.mkdtemp(prefix="elastic_ckpt_"))
           if FLAGS.store == "orbax" else HostStore())
  losses: dict[int, float] = {}
  attempts: list[dict[str, Any]] = []
  errors: list[str] = []

  def retry_policy(attempt: int, error: Exception) -> bool:
    errors.append(str(error))
    say(elastic=attempt, t=time.monotonic(), error=str(error)[:500],
        pids=pids())
    return attempt < 4  # a loop that keeps failing is a failure

  @manager.elastic_retry(minimum_slice_count=FLAGS.min_slices,
                         poll_interval=0.2, timeout=60,
                         retry_policy=retry_policy)
  def run() -> dict[str, np.ndarray]:
    active = sorted(manager.active_slice_indices)
    devices = [d for i in (active[-1:] if FLAGS.mesh == "one" else active)
               for d in manager.slice_to_devices[i]]
    mesh = Mesh(np.array(devices), ("d",))
    data = NamedSharding(mesh, P("d"))
    start, state = store.restore(NamedSharding(mesh, P()))
    attempts.append({"active": active, "devices": len(devices),
                     "from_step": start})
    say(attempt=len(attempts), t=time.monotonic(), pids=pids(),
        **attempts[-1])
    pending: list[tuple[int, jax.Array]] = []
    for step in range(start, FLAGS.steps):
      if inject is not None and step == FLAGS.fault_at and len(attempts) == 1:
        inject()
      state, loss = train_step(state, *jax.device_put(batch(step), data))
      pending.append((step, loss))
      if len(attempts) > 1 and step == start:
        loss.block_until_ready()
        say(resumed=len(attempts), t=time.monotonic())
      if (step + 1) % FLAGS.save_every == 0 or step + 1 == FLAGS.steps:
        # Reading back what ran is where a lost island's error shows; only
        # then does the state count as good.
        losses.update((s, float(l)) for s, l in pending)
        pending.clear()
        store.save(step + 1, state)
    return jax.device_get(state["params"])

  params = run()
  return {"losses": [losses[s] for s in range(FLAGS.steps)],
          "params": {k: v.tobytes().hex() for k, v in params.items()},
          "attempts": attempts, "errors": errors}


def main() -> None:
  say(pids=pids())
  reference = train(None)
  victim = islands()[VICTIM_ISLAND]["pid"]
  # Signals through it reach this worker or nothing: once it is replaced,
  # its pid may be another process's (a suite reuses pids).
  victim_fd = os.pidfd_open(victim)

  def inject() -> None:
    signal.pidfd_send_signal(victim_fd, signal.SIGKILL
                             if FLAGS.fault == "kill" else signal.SIGSTOP)
    say(fault=FLAGS.fault, pid=victim, t=time.monotonic())

  try:
    faulty = train(inject)
    say(done=True, reference=reference, faulty=faulty,
        restarts=[i["restarts"] for i in islands()], pids=pids())
  except Exception as e:  # pylint: disable=broad-except
    # What the user would see; the test judges it.
    say(failed=f"{type(e).__name__}: {e}", cause=str(e.__cause__ or ""),
        pids=pids())
  finally:
    if FLAGS.fault == "stop":
      # Replaced by now, or its cluster's restart policy was off: gone.
      try:
        signal.pidfd_send_signal(victim_fd, signal.SIGKILL)
        signal.pidfd_send_signal(victim_fd, signal.SIGCONT)
      except ProcessLookupError:
        pass


main()
