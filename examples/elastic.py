"""Elastic training: the run kills one of its own workers and finishes anyway.

    python examples/elastic.py [--hang]

A small MLP trains data parallel over every device of the embedded cluster
(2 islands x 4 devices) with jax_pathways.elastic, committing its state to
this process's memory every 5 steps. At step 22 it SIGKILLs island 1's
worker (with --hang: SIGSTOPs it, so the controller has to notice the
silence). The embedded cluster starts a new worker for the island, the loop
resumes from the last committed step, and the run ends with the same
parameters, bit for bit, as a run without the fault.
"""
import os
import signal
import sys
import time

import jax_pathways

jax_pathways.initialize(worker_timeout=2.0)  # a silent worker: lost in 2 s

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from jax_pathways import admin, elastic  # noqa: E402

STEPS, COMMIT_EVERY, FAULT_AT = 60, 5, 22  # the fault between two commits
HANG = "--hang" in sys.argv[1:]
optimizer = optax.adam(3e-2)


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
  """Batch `step` depends on the step alone: a step run again is the same."""
  rng = np.random.default_rng(step)
  x = rng.standard_normal((64, 8)).astype(np.float32)
  return x, np.sin(x.sum(axis=1, keepdims=True)).astype(np.float32)


def loss_fn(params, x, y):
  h = jnp.tanh(x @ params["w1"])
  return jnp.mean((h @ params["w2"] - y) ** 2)


def setup(devices):
  """Called at the start and whenever the islands change."""
  mesh = Mesh(np.array(devices), ("data",))
  rows = NamedSharding(mesh, P("data"))

  @jax.jit
  def train(state, x, y):
    params, opt_state = state
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  def step(state, i):
    x, y = batch(i)
    return train(state, jax.device_put(x, rows), jax.device_put(y, rows))

  return elastic.Plan(NamedSharding(mesh, P()), step)


def initial_state():
  rng = np.random.default_rng(0)
  params = {"w1": rng.standard_normal((8, 32)).astype(np.float32) * 0.3,
            "w2": rng.standard_normal((32, 1)).astype(np.float32) * 0.3}
  return params, optimizer.init(params)


fault_time = []


def on_step(step: int, loss) -> None:
  if step % 10 == 0:
    print(f"step {step:3d}  loss {float(loss):.4f}", flush=True)
  if step == FAULT_AT and not fault_time:
    address, token = jax_pathways.connection()
    pid = admin.status(address, token)["islands"][1]["pid"]
    print(f"step {step:3d}  {'stopping' if HANG else 'killing'} island 1's "
          f"worker (pid {pid})", flush=True)
    os.kill(pid, signal.SIGSTOP if HANG else signal.SIGKILL)
    fault_time.append(time.monotonic())


def on_event(e: elastic.Event) -> None:
  print(f"lost island(s) {list(e.lost)} at step {e.failed_step}: "
        f"{e.error.splitlines()[0]}")
  print(f"  detected {e.detected_at - fault_time[0]:.2f} s after the fault; "
        f"islands {list(e.islands)} ready {e.islands_at - e.detected_at:.2f} "
        f"s later; state of step {e.resumed_step} restored in "
        f"{e.placed_at - e.islands_at:.2f} s; first step (recompiled) "
        f"{e.resumed_at - e.placed_at:.2f} s", flush=True)
  print(f"  resumed from committed step {e.resumed_step} ({e.steps_redone} "
        "uncommitted steps run again)", flush=True)


result = elastic.run(setup, initial_state(), STEPS, commit_every=COMMIT_EVERY,
                     rejoin_timeout=30.0, on_step=on_step, on_event=on_event)
print(f"finished {result.step} steps on islands {list(result.islands)}")

# The same steps without a fault: no committed step was lost.
again = elastic.run(setup, initial_state(), STEPS, commit_every=COMMIT_EVERY)
same = all(np.array_equal(a, b) for a, b in zip(
    jax.tree.leaves(jax.device_get(result.state[0])),
    jax.tree.leaves(jax.device_get(again.state[0]))))
print(f"parameters bit-identical to an uninterrupted run: {same}")
