"""Plain orbax in one process on 8 CPU devices, for persistence_test.py:
`read DIR` restores DIR's step 1 and prints whether each leaf has the
expected values; `write DIR OCDBT` saves them there (OCDBT: 1 or 0).
Prints one JSON line."""
import json
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import state  # noqa: E402  pylint: disable=wrong-import-position


def main() -> None:
  mode, path = sys.argv[1], sys.argv[2]
  mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
  values = state.values()
  if mode == "read":
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(
        a.shape, a.dtype, sharding=NamedSharding(mesh, state.spec_of(a, "other"))),
        values)
    got = ocp.CheckpointManager(path).restore(1, args=ocp.args.PyTreeRestore(
        target, restore_args=ocp.checkpoint_utils.construct_restore_args(
            target)))
    print(json.dumps({k: np.asarray(got[k]).tobytes() == v.tobytes()
                      for k, v in values.items()}))
    return
  arrays = jax.tree.map(lambda a: jax.device_put(
      a, NamedSharding(mesh, state.spec_of(a, "saved"))), values)
  manager = ocp.CheckpointManager(path, item_handlers=ocp.PyTreeCheckpointHandler(
      use_ocdbt=sys.argv[3] == "1"))
  manager.save(1, args=ocp.args.PyTreeSave(arrays))
  manager.wait_until_finished()
  print(json.dumps({"saved": sorted(os.listdir(os.path.join(path, "1",
                                                            "default")))}))


if __name__ == "__main__":
  main()
