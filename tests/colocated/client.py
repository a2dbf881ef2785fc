"""A client of colocated_python_test.py in a process of its own (the
cluster: $JAX_PATHWAYS_ADDRESS). argv[1]:

  pids       calls a function on both islands, prints its colocated
             processes' pids, and exits (its session ends with it)
  mismatch   says it runs another jax than it does, then calls one
  call       calls one (on a cluster that may refuse colocated Python)

Prints one JSON line."""
import json
import os
import sys

mode = sys.argv[1]
if mode == "mismatch":
  from jax_pathways.colocated import packages  # pylint: disable=wrong-import-position
  real = packages.describe
  packages.describe = lambda: real().replace("jax=", "jax=0.0.1+other-")

import jax_pathways  # noqa: E402  pylint: disable=wrong-import-position

jax_pathways.initialize()

import jax  # noqa: E402  pylint: disable=wrong-import-position
import numpy as np  # noqa: E402  pylint: disable=wrong-import-position
from jax.experimental import colocated_python as cp  # noqa: E402  pylint: disable=wrong-import-position
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402  pylint: disable=wrong-import-position


@cp.colocated_python
def pid(a: jax.Array) -> jax.Array:
  return jax.make_array_from_single_device_arrays(
      a.shape, a.sharding,
      [jax.device_put(np.full(s.data.shape, os.getpid(), np.int32), s.device)
       for s in a.addressable_shards])


def main() -> None:
  mesh = Mesh(np.array(jax.devices()), ("d",))
  x = jax.device_put(np.zeros(len(jax.devices()), np.int32),
                     NamedSharding(mesh, P("d")))
  try:
    got = np.asarray(pid.specialize(out_specs_fn=lambda s: s)(x))
  except Exception as e:  # pylint: disable=broad-except
    print(json.dumps({"error": str(e)}), flush=True)
    return
  print(json.dumps({"pids": sorted(set(got.tolist()))}), flush=True)


if __name__ == "__main__":
  main()
