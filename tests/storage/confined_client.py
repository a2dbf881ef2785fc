"""A client of persistence_test.py on a cluster whose workers' storage root
is argv[1]: saves under it, then tries to get out of it. Prints one JSON
line: what each attempt got."""
import datetime
import json
import os
import sys

import jax_pathways

jax_pathways.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402
from pathwaysutils.persistence import helper  # noqa: E402

TIMEOUT = datetime.timedelta(seconds=60)


def attempt(run) -> str:
  try:
    run()
    return "ok"
  except Exception as e:  # pylint: disable=broad-except
    return str(e).splitlines()[0]


def main() -> None:
  root, outside = sys.argv[1], sys.argv[2]
  mesh = Mesh(np.array(jax.devices()), ("d",))
  x = jax.device_put(np.arange(16, dtype=np.float32),
                     NamedSharding(mesh, P("d")))

  def write(location):
    return lambda: helper.write_arrays(location, ["x"], [x],
                                       TIMEOUT).result(timeout=60)

  def read(location):
    def run():
      _, done = helper.read_arrays(location, ["x"], [np.dtype("float32")],
                                   [(16,)], [x.sharding], mesh.devices,
                                   TIMEOUT)
      done.result(timeout=60)
    return run

  os.symlink(outside, os.path.join(root, "link"))
  got = {"inside": attempt(write(os.path.join(root, "ck"))),
         "read_inside": attempt(read(os.path.join(root, "ck"))),
         "outside": attempt(write(outside)),
         "read_outside": attempt(read(outside)),
         "through_link": attempt(write(os.path.join(root, "link"))),
         "dotdot": attempt(write(os.path.join(root, "..", "escape")))}
  got["still_serves"] = float(jax.jit(jnp.sum)(x)) == 120.0
  print(json.dumps(got), flush=True)


if __name__ == "__main__":
  main()
