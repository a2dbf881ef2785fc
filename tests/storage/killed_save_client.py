"""A client of killed_save_test.py (the cluster: $JAX_PATHWAYS_ADDRESS):
saves a state with orbax's Pathways persistence handler into argv[1]; the
test kills a worker while the save runs. Prints one JSON line: what the
save raised, and what orbax left in the directory."""
import json
import os
import sys

os.environ["ENABLE_PATHWAYS_PERSISTENCE"] = "1"

import jax_pathways  # noqa: E402

jax_pathways.initialize()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402


def main() -> None:
  path = sys.argv[1]
  ocp.pathways.register_type_handlers(
      checkpointing_impl=ocp.pathways.CheckpointingImpl.PERSISTENCE)
  mesh = Mesh(np.array(jax.devices()), ("d",))
  n = (int(sys.argv[2]) << 20) // 4
  state = {"w": jax.jit(lambda k: jax.random.normal(k, (n,)),
                        out_shardings=NamedSharding(mesh, P("d")))(
                            jax.random.key(0))}
  jax.block_until_ready(state)
  print(json.dumps({"ready": True}), flush=True)
  manager = ocp.CheckpointManager(
      path, item_handlers=ocp.PyTreeCheckpointHandler(use_ocdbt=False))
  error = None
  try:
    manager.save(1, args=ocp.args.PyTreeSave(state))
    manager.wait_until_finished()
  except Exception as e:  # pylint: disable=broad-except
    error = f"{type(e).__name__}: {e}"
  print(json.dumps({"error": error, "steps": manager.all_steps(),
                    "left": sorted(os.listdir(path))}), flush=True)


if __name__ == "__main__":
  main()
