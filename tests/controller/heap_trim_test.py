"""A big transfer leaves nothing behind once its array is gone: after a
client has put and read back a 256 MiB array and left, the controller's and
the worker's resident memory comes back to within SLACK_MIB of what it was
before. Without jax_pathways/heap_trim.py the controller kept about the
array's size of free arena memory per round trip (1.6 GB resident after a
1 GiB one, from 0.07); without PjrtBackend.release_host_pieces the worker
kept the upload's bytes PJRT had aliased (+256 MiB) until its next upload.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from jax_pathways import admin
import cli_cluster
import processes

pytestmark = pytest.mark.integration

MIB = 256
# Resident memory a process may keep past its idle size (the bound the
# processes are given, below, plus what a round trip of allocator state
# and compiled code adds).
SLACK_MIB = 96

CLIENT = textwrap.dedent("""
    import json, sys
    import jax_pathways
    jax_pathways.initialize(sys.argv[1])
    import jax, numpy as np
    data = np.arange((int(sys.argv[2]) << 20) // 4, dtype=np.float32)
    x = jax.device_put(data, jax.devices()[0])
    print(json.dumps({"same": bool(np.array_equal(np.asarray(x), data))}),
          flush=True)
""")


def _rss_mib(pid: int) -> int:
  with open(f"/proc/{pid}/status", encoding="ascii") as f:
    for row in f:
      if row.startswith("VmRSS:"):
        return int(row.split()[1]) >> 10
  raise AssertionError(f"no VmRSS for pid {pid}")


def test_a_big_round_trip_leaves_no_heap_behind():
  env = dict(os.environ, JAX_PATHWAYS_TOKEN="heap-trim-test-token",
             # No reuse pool for transfers (common/bytes.cc), and a small
             # bound on free heap, so that what stays is what was not given
             # back.
             JAX_PATHWAYS_BUFFER_POOL_MB="0", JAX_PATHWAYS_HEAP_KEEP_MB="32")
  env.pop("JAX_PLATFORMS", None)
  procs: list[subprocess.Popen] = []
  try:
    ready = cli_cluster.start(env, 1, procs, "--devices", "1")
    controller, worker = procs
    cli_cluster.wait_for(
        "the worker joined",
        lambda: admin.status(ready["address"],
                             env["JAX_PATHWAYS_TOKEN"])["complete"], 60)
    idle = {p.pid: _rss_mib(p.pid) for p in (controller, worker)}
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, ready["address"], str(MIB)], env=env,
        cwd=cli_cluster.CWD, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True)
    procs.append(client)
    assert cli_cluster.line(client, 300) == {"same": True}
    assert client.wait(60) == 0, cli_cluster.stderr_of(client)
    for p in (controller, worker):
      cli_cluster.wait_for(
          f"pid {p.pid} back within {SLACK_MIB} MiB of its idle "
          f"{idle[p.pid]} MiB (now {_rss_mib(p.pid)} MiB)",
          lambda p=p: _rss_mib(p.pid) <= idle[p.pid] + SLACK_MIB, 60)
  finally:
    processes.stop(procs)
