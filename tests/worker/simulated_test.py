"""Simulated islands (`jax-pathways worker --simulate N`, for B10): one
process joins as N islands that answer ops without computing. The controller
must see ordinary islands: programs compile with their true signature,
launches and fetches are answered in each island's order, what cannot be
simulated fails with a clear error, and nothing is left once the client
goes. Every process is stopped by pid at the end; every wait is bounded."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any, Iterator

import pytest

from jax_pathways import admin
from jax_pathways import cli

import cli_cluster  # tests/conftest.py puts tests/ on sys.path
import processes

pytestmark = pytest.mark.integration

TOKEN = "simulated-test-token"
ISLANDS = 3

CLIENT = textwrap.dedent("""
    import json, sys
    import jax_pathways
    jax_pathways.initialize(sys.argv[1])
    import jax, jax.numpy as jnp, numpy as np
    devices = jax.devices()
    step = jax.jit(lambda x: (x * 2 + 1).astype(jnp.int32))
    fetched = []
    for d in devices[::2]:  # one device of each island
      x = jax.device_put(np.arange(6, dtype=np.float32).reshape(2, 3), d)
      for _ in range(50):
        x = step(x)
      fetched.append([str(x.dtype), list(x.shape), np.asarray(x).tolist()])
    try:
      jax.jit(jnp.sum)(jax.device_put(
          np.ones(len(devices), np.float32),
          jax.sharding.NamedSharding(jax.sharding.Mesh(devices, "i"),
                                     jax.sharding.PartitionSpec("i"))))
      spanning = "ran"
    except Exception as e:
      spanning = str(e)
    # Uploads over every island, by rows, by columns and replicated, read
    # back as zeros of their own size (the ceiling of big transfers).
    mesh = jax.sharding.Mesh(devices, "i")
    data = np.ones((6, 12), np.float32)
    spread = [np.asarray(jax.device_put(data, jax.sharding.NamedSharding(
                  mesh, jax.sharding.PartitionSpec(*spec)))).tolist()
              for spec in (("i", None), (None, "i"), ())]
    print(json.dumps({"islands": sorted({d.slice_index for d in devices}),
                      "devices": len(devices), "fetched": fetched,
                      "spanning": spanning, "spread": spread}), flush=True)
""")


@pytest.fixture(scope="module")
def cluster() -> Iterator[dict[str, Any]]:
  """A controller of 3 islands, all simulated by one worker process."""
  env = dict(os.environ, JAX_PATHWAYS_TOKEN=TOKEN)
  env.pop("JAX_PLATFORMS", None)
  procs = []
  try:
    ready = cli_cluster.start(env, ISLANDS, procs, "--simulate",
                              str(ISLANDS), "--devices", "2")
    yield {**ready, "env": env, "procs": procs}
  finally:
    processes.stop(procs)


def test_islands_answer_without_computing(cluster):
  out = subprocess.run([sys.executable, "-c", CLIENT,
                        f"grpc://{cluster['address']}"],
                       env=cluster["env"], capture_output=True, text=True,
                       timeout=180, cwd=cli_cluster.CWD, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["islands"] == list(range(ISLANDS))
  assert result["devices"] == 2 * ISLANDS
  # The program's true signature (int32 out of float32), zeros for values.
  assert result["fetched"] == [["int32", [2, 3], [[0] * 3] * 2]] * ISLANDS
  assert "simulated islands run island-local programs" in result["spanning"]
  assert result["spread"] == [[[0.0] * 12] * 6] * 3
  status = admin.status(cluster["address"], TOKEN)
  assert all(i["alive"] and i["finished"] >= 50 for i in status["islands"])
  assert {i["pid"] for i in status["islands"]} == {cluster["procs"][1].pid}
  after = cli_cluster.wait_for(
      "the client's arrays to leave the books",
      lambda: (lambda s: s if not s["clients"] and not s["live_buffers"]
               else None)(admin.status(cluster["address"], TOKEN)), 30)
  assert after["host_buffer_bytes"] == 0


@pytest.mark.parametrize("argv, message", [
    (["--simulate", "0"], "--simulate=0 must be >= 1"),
    (["--simulate", "2", "--island", "1"], "--simulate takes neither"),
    (["--simulate", "2", "--platform", "cuda"], "--simulate takes neither"),
])
def test_simulate_flags_are_checked(argv, message, capfd):
  with pytest.raises(SystemExit) as e:
    cli.main(["worker", "--controller", "127.0.0.1:1", *argv])
  assert e.value.code == 2
  assert message in capfd.readouterr().err
