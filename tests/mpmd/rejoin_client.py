"""Run by rejoin_test.py in a process of its own: pipeline steps over an
embedded cluster of 3 islands across the loss of island 1's worker and its
restart by the cluster's supervisor. Each island has 2 devices; the meshes
use the first, the second takes a copy of a step's output (assembled()).

argv[1:]: the partitioners of the pipeline over islands 0 and 1 ("shardy",
"jax_pathways"). A pipeline over islands 0 and 2 ("other") runs too. Prints
one JSON line per phase: "started", "before", "lost", "rejoined", "stale";
"steps" holds each step's result as {"digest": sha256 of its output bits,
"ref_error": vs plain JAX} or {"errors": what the user saw}, "island"
island 1's status after them.
"""
import hashlib
import json
import os
import signal
import sys
import time
from typing import Any, Callable

os.environ["JAX_PLATFORMS"] = "proxy,cpu"
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax_pathways  # noqa: E402
from jax_pathways.cluster import restarts  # noqa: E402
import processes  # noqa: E402  tests/processes.py

# The restarted worker waits this long before it starts, so the steps "lost"
# runs meet the island lost, not back already.
restarts.RESTART_DELAYS_S = (2.0,)
jax_pathways.initialize(islands=3, devices_per_island=2)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from jax_pathways import admin, mpmd  # noqa: E402
import models  # noqa: E402

M = 4
LOST = 1


def say(**kw: Any) -> None:
  print(json.dumps(kw), flush=True)


def island(number: int) -> dict[str, Any]:
  return {i["island"]: i for i in admin.status(
      cluster.address, cluster.token)["islands"]}[number]


def wait_for(what: str, predicate: Callable[[], bool], timeout: float) -> None:
  deadline = time.monotonic() + timeout
  while not predicate():
    if time.monotonic() > deadline:
      raise TimeoutError(f"{what} within {timeout} s")
    time.sleep(0.05)


cluster = jax_pathways.local_cluster()
# With when each started: a pid names the same process only with it.
say(phase="started", pids={p: processes.started(p) for p in cluster.pids},
    victim=cluster.workers[LOST].pid)
model = models.make_mlp(stages=2, microbatches=M)
batch = (model.x, model.y)
cpu = jax.devices("cpu")[0]
ref_params, ref_loss = model.reference_step(
    jax.device_put(model.params, cpu), jax.device_put(model.x, cpu),
    jax.device_put(model.y, cpu))
reference = [ref_loss, *jax.tree.leaves(ref_params)]


def pipeline(islands: list[int], partitioner: str) -> mpmd.Pipeline:
  return mpmd.pipeline(model.train_step,
                       mpmd.Topology.islands(islands, devices_per_mesh=1),
                       stages={"s0": islands[0], "s1": islands[1]},
                       schedule="1F1B", microbatches=M, batch_argnums=(1,),
                       partitioner=partitioner)


steps = {p: pipeline([0, LOST], p) for p in sys.argv[1:]}
steps["other"] = pipeline([0, 2], "auto")   # never on the lost island
returned: dict[str, Any] = {}   # each step's parameters, as it returned them


def run(name: str, params: Any = model.params) -> dict[str, Any]:
  """One step of `steps[name]` and what it gave: every output read back, or
  the distinct errors of those that failed."""
  try:
    new_params, loss = steps[name](params, batch)
  except Exception as e:  # pylint: disable=broad-except
    return {"errors": [f"{type(e).__name__}: {e}"]}
  returned[name] = new_params
  got, errors = [], set()
  for x in [loss, *jax.tree.leaves(new_params)]:
    try:
      got.append(jax.device_get(x))
    except Exception as e:  # pylint: disable=broad-except
      errors.add(f"{type(e).__name__}: {e}")
  if errors:
    return {"errors": sorted(errors)}
  return {"digest": hashlib.sha256(b"".join(x.tobytes() for x in got)
                                   ).hexdigest(),
          "ref_error": max(models.relative_error(a, b)
                           for a, b in zip(got, reference))}


def assembled(name: str) -> dict[str, Any]:
  """A parameter the step left on island 1 and a copy on the island's other
  device, made one array: the step's outputs are the new worker's arrays
  like any other."""
  try:
    leaf = jax.tree.leaves(returned[name])[-1]
    devices = [d for d in jax.devices() if d.slice_index == LOST]
    whole = jax.make_array_from_single_device_arrays(
        leaf.shape, NamedSharding(Mesh(np.array(devices), ("d",)), P()),
        [leaf, jax.device_put(leaf, devices[1])])
    want = np.asarray(leaf)  # np.array_equal would hide a read's error
    return {"same": all(np.array_equal(np.asarray(s.data), want)
                        for s in whole.addressable_shards)}
  except Exception as e:  # pylint: disable=broad-except
    return {"error": f"{type(e).__name__}: {e}"}


say(phase="before", steps={name: run(name) for name in steps},
    partitioners={name: step.partitioner for name, step in steps.items()})

victim = cluster.workers[LOST].pid
os.kill(victim, signal.SIGKILL)
wait_for("island 1 lost", lambda: not island(LOST)["alive"], 10)
began = time.monotonic()
# The steps over island 1 as a training loop would take them next: on the
# parameters the last one returned (some were lost with it). The other one
# on fresh parameters, to compare with its first step.
lost = {name: run(name, model.params if name == "other" else returned[name])
        for name in steps}
say(phase="lost", steps=lost, took_s=time.monotonic() - began,
    island=island(LOST))
# Parameters the steps returned before or during the loss: those on island 1
# stay failed for good.
stale = {name: returned[name] for name in sys.argv[1:]}



def restarted() -> bool:
  now = island(LOST)
  return now["alive"] and now["generation"] == 1


wait_for("island 1 restarted", restarted, 60)
began = time.monotonic()
# The same Pipeline objects: their executables compiled before the loss.
say(phase="rejoined", steps={name: run(name) for name in steps},
    took_s=time.monotonic() - began, island=island(LOST),
    island_started=processes.started(island(LOST)["pid"]),
    assembled={name: assembled(name) for name in sys.argv[1:]})


def fast_executes() -> int:
  return admin.status(cluster.address, cluster.token)["fast_path"]["executes"]


def on_island(x: jax.Array, number: int) -> bool:
  return {d.slice_index for d in x.sharding.device_set} == {number}


def stale_step(name: str) -> dict[str, Any]:
  """A step on stage 0's stale parameters (failed with the loss, held on
  island 0) and stage 1's good ones, answered in C++: stage 0 fails at once
  on its failed arguments, and so must island 1's receives of what it would
  have sent (submitted after their sends), not wait for bytes that never
  come. Stage 1's stale parameters could not be taken in C++: they are the
  lost worker's generation's."""
  # A step on a step's own outputs first: Python takes parameters laid out
  # as outputs (as the stale ones are) once, then the fast path does.
  run(name, returned[name])
  mixed = jax.tree.map(lambda old, new: old if on_island(old, 0) else new,
                       stale[name], returned[name])
  taken = fast_executes()
  got = run(name, mixed)
  return {**got, "fast_path": fast_executes() - taken}


began = time.monotonic()
say(phase="stale", steps={name: stale_step(name) for name in sys.argv[1:]},
    took_s=time.monotonic() - began,
    after={name: run(name) for name in sys.argv[1:]})
