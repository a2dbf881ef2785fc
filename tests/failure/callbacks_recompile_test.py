"""A program whose compile asks its client (custom_partitioning), spanning
both islands, is compiled again when a lost island's worker is replaced:
the controller answers the new compile from what the client said the
first time, and the program runs again, right."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from jax_pathways import admin
from jax_pathways.cluster.local_cluster import LocalCluster

import processes  # tests/conftest.py puts tests/ on sys.path

pytestmark = pytest.mark.integration

WAIT_S = 120.0

CLIENT = textwrap.dedent("""
    import json, sys, time
    import jax_pathways
    jax_pathways.initialize(sys.argv[1], token=sys.argv[2])
    import jax, jax.numpy as jnp, numpy as np
    from jax.experimental.custom_partitioning import custom_partitioning
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    asked = []

    @custom_partitioning
    def double(x):
      return x * 2

    def partition(mesh, arg_shapes, result_shape):
      asked.append("partition")
      s = arg_shapes[0].sharding
      return mesh, lambda x: x * 2, s, (s,)

    double.def_partition(
        infer_sharding_from_operands=lambda mesh, a, r: a[0].sharding,
        partition=partition, sharding_rule="i j -> i j")
    mesh = Mesh(np.array(jax.devices()), ("d",))
    step = jax.jit(lambda x: double(x) + 1)
    x = np.arange(64, dtype=np.float32).reshape(16, 4)

    def run():
      got = np.asarray(step(jax.device_put(x, NamedSharding(mesh, P("d")))))
      return bool(np.array_equal(got, x * 2 + 1))

    print(json.dumps({"ok": run(), "asked": len(asked)}), flush=True)
    sys.stdin.readline()  # the test killed a worker meanwhile
    deadline = time.monotonic() + 120
    while True:
      try:
        ok = run()
        break
      except Exception as e:  # the loss, until the island is back
        if time.monotonic() > deadline:
          raise
        time.sleep(0.2)
    print(json.dumps({"ok": ok, "asked": len(asked)}), flush=True)
""")


def test_a_recompile_after_a_lost_worker_asks_the_client_nothing(tmp_path):
  cluster = LocalCluster(2, 4, 16)
  cluster.start()
  pids = list(cluster.pids)
  client = None
  try:
    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, cluster.address, cluster.token],
        env=env, cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=open(tmp_path / "client.log", "w"), text=True)
    first = json.loads(client.stdout.readline() or "{}")
    assert first == {"ok": True, "asked": 1}, (tmp_path / "client.log"
                                              ).read_text()[-3000:]
    os.kill(cluster.workers[1].pid, signal.SIGKILL)
    deadline = time.monotonic() + WAIT_S
    while True:  # its replacement joined
      islands = admin.status(cluster.address, cluster.token)["islands"]
      if islands[1]["generation"] == 1 and islands[1]["alive"]:
        break
      assert time.monotonic() < deadline, islands
      time.sleep(0.1)
    client.stdin.write("again\n")
    client.stdin.flush()
    second = json.loads(client.stdout.readline() or "{}")
    # Both islands compiled it again for the new global client; nobody
    # asked the client.
    assert second == {"ok": True, "asked": 1}, (tmp_path / "client.log"
                                               ).read_text()[-3000:]
  finally:
    if client is not None:
      client.kill()
      client.wait(timeout=30)
    pids = list(set(pids + list(cluster.pids)))
    cluster.stop()
  assert not [p for p in pids if processes.alive(p)]
