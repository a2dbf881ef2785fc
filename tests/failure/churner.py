"""One client process of the churn test: short sessions, one after another,
each announcing its phase on stdout before it starts it, so the test can
SIGKILL it right in the middle of that phase.

    churner.py ADDRESS TOKEN raw SESSIONS   uploads and downloads, raw gRPC
    churner.py ADDRESS TOKEN jax            one JAX session: compile, execute

Prints JSON lines: {"phase": ...} before each phase, {"ok": ...} after a
checked result, {"done": true} at the end.
"""
import json
import os
import sys

import numpy as np


def say(**kw) -> None:
  print(json.dumps(kw), flush=True)


def raw(address: str, token: str, sessions: int) -> None:
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..",
                                  "controller"))
  from raw_client import RawSession  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(os.getpid())
  for _ in range(sessions):
    session = RawSession(address, token, timeout=60)
    # 1-4 MB: several 1 MB chunks each way, long enough to be killed in.
    values = rng.normal(size=int(rng.integers(1, 5)) << 18).astype(
        np.float32)
    say(phase="upload")
    session.store(1, values.tobytes())
    reply = session.wait(session.send_make_array(1, 1, values.size))
    assert reply.response_metadata.status.code == 0, reply
    say(phase="download")
    got = np.frombuffer(session.fetch(1, 2), np.float32)
    say(ok=bool(np.array_equal(got, values)))
    session.close()


def jax_session(address: str, token: str) -> None:
  import jax_pathways  # pylint: disable=import-outside-toplevel
  jax_pathways.initialize(address, token=token)
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  def body(_, x):
    return jnp.tanh(x @ x) * 0.5 + x

  @jax.jit
  def work(x, steps):
    # Long enough to be killed while it runs (a loop of matmuls).
    return jax.lax.fori_loop(0, steps, body, x).sum()

  x = jax.device_put(np.eye(256, dtype=np.float32) * 0.1, jax.devices()[1])
  say(phase="compile")
  work.lower(x, 1).compile()
  say(phase="execute")
  got = np.asarray(work(x, 300))
  with jax.default_device(jax.devices("cpu")[0]):  # plain JAX, same bits
    want = np.asarray(work(np.asarray(x), 300))
  say(ok=got.tobytes() == want.tobytes())


if __name__ == "__main__":
  if sys.argv[3] == "raw":
    raw(sys.argv[1], sys.argv[2], int(sys.argv[4]))
  else:
    jax_session(sys.argv[1], sys.argv[2])
  say(done=True)
