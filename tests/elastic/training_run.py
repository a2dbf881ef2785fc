"""A client that trains with jax_pathways.elastic while hurting its cluster.

argv[1]: JSON settings:
  address, token:     a running controller; absent: an embedded cluster of
                      `islands` x `devices` (worker_timeout, restart_workers)
  steps, commit_every, rejoin_timeout, min_islands, commit_dir
  faults:             [[after step, "kill" | "stop" | "hammer", island],
                      ...]: the island's current worker gets SIGKILL /
                      SIGSTOP; "hammer" (embedded cluster) SIGKILLs each
                      worker the supervisor starts until it gives up
  bring_back:         embedded cluster: an event saying the supervisor
                      gave up on an island restarts its worker
                      (restart_worker) and waits until it is up
  restart_delays:     embedded cluster: cluster/restarts.py's RESTART_DELAYS_S
  reference:          also run the same steps without faults on the final
                      islands and report its parameters (committing every
                      reference_commit_every steps)
  ballast_mib:        the state also holds this many MiB made on the
                      devices (sharded over them; the steps pass it on):
                      with cap_headroom_mib, this process's address space
                      is then capped at what it has plus that many MiB,
                      less than the state (it tries to allocate its size)
  cpu_reference:      N: also run them on N devices of plain JAX on CPU

Prints one JSON line: the final parameters (hex), the loss of every step
run (steps run again after a loss appear again), the events and the pids
it stopped (the caller kills those that are left).

The model: an MLP trained with optax's adam, data parallel over a mesh of
every device in use; batch i is a function of i alone, so a step run again
from the same state gives the same bits.
"""
import json
import os
import signal
import sys
import time

settings = json.loads(sys.argv[1])
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import processes  # noqa: E402  tests/processes.py

import jax_pathways  # noqa: E402

if "address" in settings:
  jax_pathways.initialize(settings["address"], token=settings["token"])
else:
  if "restart_delays" in settings:
    from jax_pathways.cluster import restarts
    restarts.RESTART_DELAYS_S = tuple(settings["restart_delays"])
  jax_pathways.initialize(
      islands=settings["islands"], devices_per_island=settings["devices"],
      worker_timeout=settings.get("worker_timeout"),
      restart_workers=settings.get("restart_workers", True))

import jax  # noqa: E402

if settings.get("cpu_reference"):  # before JAX's CPU backend is made
  jax.config.update("jax_num_cpu_devices", settings["cpu_reference"])

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from jax_pathways import admin, elastic  # noqa: E402

BATCH = 48  # divides 8, 6, 4 and 2 devices
optimizer = optax.adam(3e-2)


def batch(i: int) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(i)
  x = rng.standard_normal((BATCH, 8)).astype(np.float32)
  y = np.tanh(x @ np.linspace(-1, 1, 8, dtype=np.float32))[:, None]
  return x, y.astype(np.float32)


def loss_fn(params, x, y):
  h = jnp.tanh(x @ params["w1"] + params["b1"])
  return jnp.mean((h @ params["w2"] - y) ** 2)


def setup(devices):
  mesh = Mesh(np.array(devices), ("data",))
  replicated = NamedSharding(mesh, P())
  rows = NamedSharding(mesh, P("data"))

  @jax.jit
  def train(state, x, y):
    params, opt_state, *ballast = state
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state, *ballast), loss

  def step(state, i):
    x, y = batch(i)
    return train(state, jax.device_put(x, rows), jax.device_put(y, rows))

  if BALLAST:
    return elastic.Plan((replicated, replicated, rows), step)
  return elastic.Plan(replicated, step)


BALLAST = settings.get("ballast_mib", 0) << 18  # float32s


def ballast_values():
  """On the devices of every island, never in this process."""
  rows = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))
  return jax.jit(lambda: jnp.arange(BALLAST, dtype=jnp.float32) % 251,
                 out_shardings=rows)()


def initial_state():
  rng = np.random.default_rng(0)
  params = {"w1": rng.standard_normal((8, 16)).astype(np.float32) * 0.5,
            "b1": np.zeros(16, np.float32),
            "w2": rng.standard_normal((16, 1)).astype(np.float32) * 0.5}
  state = (params, jax.tree.map(np.asarray, optimizer.init(params)))
  return (*state, ballast_values()) if BALLAST else state


def cap_address_space(headroom_mib: int) -> bool:
  """Caps this process's address space at what it has plus `headroom_mib`;
  whether it could still allocate the ballast's size after."""
  import resource
  with open("/proc/self/status", encoding="ascii") as f:
    vm = int(next(l for l in f if l.startswith("VmSize:")).split()[1]) << 10
  resource.setrlimit(resource.RLIMIT_AS, (
      vm + (headroom_mib << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))
  try:
    np.ones(BALLAST * 4, np.uint8)
    return True
  except MemoryError:
    return False


address, token = jax_pathways.connection()
faults = {int(s): (what, int(island))
          for s, what, island in settings.get("faults", [])}
losses: list[tuple[int, float]] = []
hurt: list[dict] = []


def hammer(step: int, island: int) -> None:
  """SIGKILLs island's workers as the supervisor starts them, until it
  gives up (a hang guard of 120 s)."""
  cluster = jax_pathways.local_cluster()
  deadline = time.monotonic() + 120
  while not (next(x for x in admin.status(address, token)["islands"]
                 if x["island"] == island).get("supervisor") or {}).get(
                     "given_up"):
    assert time.monotonic() < deadline, "the supervisor never gave up"
    worker = cluster.workers[island]
    if worker.poll() is None and worker.pid not in {h["pid"] for h in hurt}:
      started = processes.started(worker.pid)
      os.kill(worker.pid, signal.SIGKILL)
      hurt.append({"step": step, "what": "kill", "island": island,
                   "pid": worker.pid, "started": started,
                   "at": time.monotonic()})
    time.sleep(0.02)


def on_step(i: int, loss) -> None:
  losses.append((i, float(loss)))
  if i in faults and i not in {h["step"] for h in hurt}:
    what, island = faults[i]
    if what == "hammer":
      hammer(i, island)
      return
    pid = next(x["pid"] for x in admin.status(address, token)["islands"]
               if x["island"] == island)
    started = processes.started(pid)
    os.kill(pid, signal.SIGKILL if what == "kill" else signal.SIGSTOP)
    hurt.append({"step": i, "what": what, "island": island, "pid": pid,
                 "started": started, "at": time.monotonic()})


events = []


def on_event(e: elastic.Event) -> None:
  if e.given_up and settings.get("bring_back"):
    from jax_pathways.elastic import islands as islands_lib
    for island in e.lost:
      jax_pathways.local_cluster().restart_worker(island)
    islands_lib.wait(lambda up: set(e.lost) <= up, 120)
  events.append({"kind": e.kind, "lost": list(e.lost),
                 "given_up": e.given_up,
                 "failed_step": e.failed_step,
                 "resumed_step": e.resumed_step, "islands": list(e.islands),
                 "error": e.error.splitlines()[0] if e.error else "",
                 "detected_at": e.detected_at, "islands_at": e.islands_at,
                 "placed_at": e.placed_at, "resumed_at": e.resumed_at})


start = initial_state()
could_hold = (cap_address_space(settings["cap_headroom_mib"])
              if "cap_headroom_mib" in settings else None)
result = elastic.run(setup, start, settings["steps"],
                     commit_every=settings["commit_every"],
                     rejoin_timeout=settings["rejoin_timeout"],
                     min_islands=settings.get("min_islands", 1),
                     grow=settings.get("grow", True),
                     on_step=on_step, on_event=on_event,
                     commit_dir=settings.get("commit_dir"))
out = {"params": jax.tree.map(lambda a: np.asarray(a).tobytes().hex(),
                              result.state[0]),
       "islands": list(result.islands), "losses": losses, "events": events,
       "hurt": hurt}
if BALLAST:
  out["could_hold_state"] = could_hold
  out["ballast_kept"] = bool(jax.jit(jnp.array_equal)(result.state[2],
                                                      ballast_values()))
if settings.get("reference"):
  # Commits change no bits: the reference commits only as often as asked
  # (reference_commit_every, default commit_every).
  again = elastic.run(setup, initial_state(), settings["steps"],
                      islands=result.islands,
                      commit_every=settings.get("reference_commit_every",
                                                settings["commit_every"]),
                      commit_dir=settings.get("commit_dir"))
  assert not again.events, again.events
  out["reference"] = jax.tree.map(lambda a: np.asarray(a).tobytes().hex(),
                                  again.state[0])
if settings.get("cpu_reference"):
  plan = setup(jax.devices("cpu"))
  state = jax.device_put(initial_state(), plan.state_sharding)
  for i in range(settings["steps"]):
    state, _ = plan.step(state, i)
  out["cpu_reference"] = jax.tree.map(
      lambda a: np.asarray(a).tobytes().hex(), state[0])
print(json.dumps(out), flush=True)
for h in hurt:  # a stopped worker nobody replaced must not linger
  if h["what"] == "stop":
    try:
      os.kill(h["pid"], signal.SIGKILL)
    except ProcessLookupError:
      pass
