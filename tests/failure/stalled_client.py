"""A client of the controller at argv[1] (token in JAX_PATHWAYS_TOKEN,
JAX_PATHWAYS_CONTROLLER_TIMEOUT set by the test): prints "ready" after a
first call, then, once a line arrives on stdin (the test has stopped the
controller), calls again and prints what each call raised."""
import sys

import jax
import numpy as np

import jax_pathways

jax_pathways.initialize(sys.argv[1])
step = jax.jit(lambda x: x + 1)
x = np.arange(4.0, dtype=np.float32)
assert (np.asarray(step(x)) == x + 1).all()
print("ready", flush=True)
sys.stdin.readline()
for attempt in ("waiting", "later"):
  try:
    np.asarray(step(x))
    print(f"{attempt}: no error", flush=True)
  except Exception as e:  # pylint: disable=broad-except
    print(f"{attempt}: {type(e).__name__}: {e}".splitlines()[0], flush=True)
