"""A client of persistence_test.py whose address space is capped below its
state: it saves and restores the state with orbax's Pathways handler,
which the workers serve, so no byte of it enters this process.

argv: checkpoint directory, state MiB, headroom MiB (what the cap leaves
above this process's address space once warmed up), orbax's
CheckpointingImpl (PERSISTENCE or COLOCATED_PYTHON: the islands' colocated
processes save and restore). Prints one JSON line.
"""
import json
import os
import resource
import sys

os.environ["ENABLE_PATHWAYS_PERSISTENCE"] = "1"

import jax_pathways  # noqa: E402

jax_pathways.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402


def vm_bytes() -> int:
  with open("/proc/self/status", encoding="ascii") as f:
    line = next(l for l in f if l.startswith("VmSize:"))
  return int(line.split()[1]) << 10


def save_and_restore(path: str, state: dict) -> dict:
  manager = ocp.CheckpointManager(
      path, item_handlers=ocp.PyTreeCheckpointHandler(use_ocdbt=False))
  manager.save(1, args=ocp.args.PyTreeSave(state))
  manager.wait_until_finished()
  target = jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
      state)
  return manager.restore(1, args=ocp.args.PyTreeRestore(
      target, restore_args=ocp.checkpoint_utils.construct_restore_args(
          target)))


def main() -> None:
  path, state_mib, headroom_mib = sys.argv[1], int(sys.argv[2]), int(
      sys.argv[3])
  ocp.pathways.register_type_handlers(
      checkpointing_impl=ocp.pathways.CheckpointingImpl[sys.argv[4]])
  mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
  sharded = NamedSharding(mesh, P(("data", "model")))
  n = (state_mib << 20) // 4 // 2  # float32s in each of two leaves
  # Made on the islands: the state never exists in this process.
  make = jax.jit(lambda k: {"a": jax.random.normal(k, (n,)),
                            "b": jax.random.uniform(k, (n,))},
                 out_shardings=sharded)
  state = make(jax.random.key(0))
  # Everything a save and restore loads (modules, threads) loaded first.
  save_and_restore(os.path.join(path, "warm"), make(jax.random.key(1)))
  cap = vm_bytes() + (headroom_mib << 20)
  resource.setrlimit(resource.RLIMIT_AS,
                     (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
  try:
    np.ones(state_mib << 20, np.uint8)
    holds_state = True
  except MemoryError:
    holds_state = False
  restored = save_and_restore(os.path.join(path, "state"), state)
  equal = jax.jit(lambda x, y: jax.tree.reduce(
      jnp.logical_and, jax.tree.map(lambda u, v: jnp.array_equal(u, v), x,
                                    y)))(state, restored)
  print(json.dumps({"equal": bool(equal), "could_hold_state": holds_state,
                    "restored_sharding_same": all(
                        restored[k].sharding == state[k].sharding
                        for k in state)}), flush=True)


if __name__ == "__main__":
  main()
