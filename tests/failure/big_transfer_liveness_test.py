"""Liveness never waits behind bytes (issue 52 item 1): arrays of GiBs put
and fetched by rows, by columns and replicated, over both islands, while
every core is kept busy by other processes, declare no island lost, and
come back bit for bit. The suite runs it at 64 MiB; `pytest -m slow` at
2 GiB."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import cli_cluster
import processes

pytestmark = pytest.mark.integration

CLIENT = textwrap.dedent("""
    import hashlib, json, sys
    import jax_pathways
    jax_pathways.initialize()
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mib = int(sys.argv[1])
    cols = 4096
    data = np.arange((mib << 20) // 4, dtype=np.float32).reshape(-1, cols)
    mesh = Mesh(np.array(jax.devices()), ("d",))
    for spec in (P("d", None), P(None, "d"), P()):
      x = jax.device_put(data, NamedSharding(mesh, spec))
      back = np.asarray(x)
      print(json.dumps({"spec": str(spec),
                        "same": bool(np.array_equal(back, data))}),
            flush=True)
      del x, back
    print(json.dumps({"done": True}), flush=True)
""")

BURN = "while True: pass"


def _transfers_declare_no_island_lost(mib: int) -> None:
  from jax_pathways.cluster.local_cluster import LocalCluster  # pylint: disable=import-outside-toplevel
  burners: list[subprocess.Popen] = []
  with processes.running(LocalCluster(2, 2, 16)) as cluster:
    env = dict(os.environ, JAX_PATHWAYS_ADDRESS=cluster.address,
               JAX_PATHWAYS_TOKEN=cluster.token)
    env.pop("JAX_PLATFORMS", None)
    client = subprocess.Popen([sys.executable, "-c", CLIENT, str(mib)],
                              env=env, cwd=cli_cluster.CWD,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
    burners.append(client)
    try:
      for _ in range(len(os.sched_getaffinity(0))):
        burners.append(subprocess.Popen([sys.executable, "-c", BURN],
                                        start_new_session=True))
      answers = [cli_cluster.line(client, 600) for _ in range(4)]
    finally:
      processes.stop(burners)
    assert answers[-1] == {"done": True}, answers
    assert all(a["same"] for a in answers[:3]), answers
    status = cli_cluster.island
    for island in (0, 1):
      seen = status(cluster.controller_address, cluster.token, island)
      assert seen["alive"] and not seen["last_lost"], seen
    assert cluster.restarts == [0, 0]


def test_big_transfers_on_a_busy_machine_lose_no_island():
  _transfers_declare_no_island_lost(64)


@pytest.mark.slow
def test_multi_gib_transfers_on_a_busy_machine_lose_no_island():
  _transfers_declare_no_island_lost(2048)

