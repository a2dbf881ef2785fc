"""One client process of B7 (benchmarks/ordering_benchmark.py).

Joins the controller at JAX_PATHWAYS_ADDRESS, compiles collectives (psum,
pmax, ppermute) over device sets that span both islands and overlap, and
prints {"ready": true}. Then, for every "go" line on stdin, issues
--programs of them chosen at random, on random integer data, without
blocking and with random gaps, reads every result, compares it exactly with
numpy, and prints {"wrong": n, "programs": k, "example": ...} (or
{"error": ...}).
"""
import argparse
import json
import random
import sys
import time

import jax_pathways

jax_pathways.initialize()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

# Each spans islands 0 (devices 0-3) and 1 (4-7); they overlap.
DEVICE_SETS = [(0, 1, 2, 3, 4, 5, 6, 7), (2, 3, 4, 5), (1, 2, 5, 6), (3, 4),
               (0, 7)]
OPS = {
    "psum": (lambda a: jax.lax.psum(a, "i"),
             lambda x: np.broadcast_to(x.sum(0), x.shape)),
    "pmax": (lambda a: jax.lax.pmax(a, "i"),
             lambda x: np.broadcast_to(x.max(0), x.shape)),
    "ppermute": (None, lambda x: np.roll(x, 1, axis=0)),
}


def say(**kw):
  print(json.dumps(kw), flush=True)


def program(devices, op):
  mesh = Mesh(np.array([jax.devices()[d] for d in devices]), ("i",))
  n = len(devices)
  body = OPS[op][0] or (lambda a: jax.lax.ppermute(
      a, "i", [(k, (k + 1) % n) for k in range(n)]))
  fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"),
                             out_specs=P("i")))
  return fn, NamedSharding(mesh, P("i"))


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--programs", type=int, default=6)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  rng = random.Random(args.seed)
  data = np.random.default_rng(args.seed)
  programs = {(d, op): program(d, op) for d in DEVICE_SETS for op in OPS}

  def issue(key):
    fn, sharding = programs[key]
    x = data.integers(-1000, 1000, size=(len(key[0]), 8)).astype(np.float32)
    return fn(jax.device_put(x, sharding)), OPS[key[1]][1](x), key

  for key in programs:  # compile and check each once, alone
    out, want, _ = issue(key)
    assert np.array_equal(np.asarray(out), want), key
  say(ready=True)

  for line in sys.stdin:
    if line.strip() != "go":
      break
    try:
      issued = []
      for _ in range(args.programs):
        issued.append(issue(rng.choice(list(programs))))
        time.sleep(rng.random() * 5e-4)
      wrong, example = 0, None
      for out, want, (devices, op) in issued:
        got = np.asarray(out)
        if not np.array_equal(got, want):
          wrong += 1
          example = example or {"op": op, "devices": devices,
                                "got": got[0, :3].tolist(),
                                "want": want[0, :3].tolist()}
      say(wrong=wrong, programs=len(issued), example=example)
    except Exception as e:  # pylint: disable=broad-except
      say(error=f"{type(e).__name__}: {str(e)[:300]}")


if __name__ == "__main__":
  main()
