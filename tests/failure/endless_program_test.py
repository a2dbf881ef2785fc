"""A program that never ends no longer keeps its island from everyone
(issue 53 row 4): the owner's bound on a program's run time, its client
leaving, and an operator's `jax-pathways cancel` each take the island back.
Its worker is dropped and started again by the embedded cluster's
supervisor; the program's client and every client with arrays there get
an error that says why, and the island serves again. Work of other
clients on other islands goes on meanwhile."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest

import cli_cluster
import processes

pytestmark = pytest.mark.integration

# Loops for ever: v stays 1 (> -1), which XLA cannot know.
ENDLESS = textwrap.dedent("""
    import json
    import jax_pathways
    jax_pathways.initialize()
    import jax, numpy as np
    from jax import lax
    x = jax.device_put(np.ones(4, np.float32), jax.devices()[0])
    y = jax.jit(lambda v: lax.while_loop(lambda v: v[0] > -1.0,
                                         lambda v: v * 0.5 + 0.5, v))(x)
    print(json.dumps({"launched": True}), flush=True)
    try:
      print(json.dumps({"value": np.asarray(y).tolist()}), flush=True)
    except Exception as e:  # what the user sees
      print(json.dumps({"error": str(e)}), flush=True)
""")

# Another client, driven over stdin: "keep" makes an array on island 0;
# "use" computes on it; "compute D" runs a program on device D.
OTHER = textwrap.dedent("""
    import json, sys
    import jax_pathways
    jax_pathways.initialize()
    import jax, numpy as np
    data = np.linspace(-3, 3, 64, dtype=np.float32)
    f = jax.jit(lambda a: a * 2.5 + 1.0)
    kept = None

    def attempt(fn):
      try:
        return {"value": np.asarray(fn()).tolist()}
      except Exception as e:
        return {"error": str(e)}

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
      verb, *arg = line.split()
      if verb == "keep":
        kept = f(jax.device_put(data, jax.devices()[0]))
        answer = attempt(lambda: kept)
      elif verb == "use":
        answer = attempt(lambda: f(kept))
      else:
        answer = attempt(lambda: f(jax.device_put(
            data, jax.devices()[int(arg[0])])))
      print(json.dumps(answer), flush=True)
""")



def _env(cluster: Any) -> dict[str, str]:
  env = dict(os.environ, JAX_PATHWAYS_ADDRESS=cluster.address,
             JAX_PATHWAYS_TOKEN=cluster.token)
  env.pop("JAX_PLATFORMS", None)
  return env


@pytest.fixture(name="expected", scope="module")
def _expected(cpu_devices) -> list[float]:
  """What the other client computes, by plain JAX on this process's CPU."""
  import jax  # pylint: disable=import-outside-toplevel
  data = jax.device_put(np.linspace(-3, 3, 64, dtype=np.float32),
                        cpu_devices[0])
  return np.asarray(jax.jit(lambda a: a * 2.5 + 1.0)(data)).tolist()


def _client(env: dict[str, str], source: str) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-c", source], env=env,
                          cwd=cli_cluster.CWD, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True)


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
  """`jax-pathways ARGS`, as an operator runs it."""
  return subprocess.run([sys.executable, "-m", "jax_pathways.cli", *args],
                        env=env, cwd=cli_cluster.CWD, capture_output=True,
                        text=True, timeout=60, check=False)


def _ask(client: subprocess.Popen, command: str) -> dict[str, Any]:
  client.stdin.write(command + "\n")
  client.stdin.flush()
  return cli_cluster.line(client, 120)


def _island0(cluster: Any) -> dict[str, Any]:
  return cli_cluster.island(cluster.controller_address, cluster.token, 0)


def _endless_running(cluster: Any) -> tuple[subprocess.Popen, int]:
  """A client whose endless program runs on island 0, and its number."""
  endless = _client(_env(cluster), ENDLESS)
  assert cli_cluster.line(endless, 120) == {"launched": True}
  running = cli_cluster.wait_for("the endless program to run",
                                 lambda: _island0(cluster)["running"], 60)
  assert running["program"].startswith("jit_"), running
  return endless, running["client"]


def _back(cluster: Any, generation: int) -> dict[str, Any]:
  """Island 0 once a new worker (generation `generation`) serves it."""
  return cli_cluster.wait_for(
      "island 0's new worker",
      lambda: (lambda i: i if i["alive"] and i["generation"] >= generation
               else None)(_island0(cluster)), 120)


@pytest.fixture(name="stopped")
def _stopped():
  """Clients a test started, killed by pid at its end."""
  procs: list[subprocess.Popen] = []
  yield procs
  processes.stop(procs)


# A program of island 0's two devices whose callback runs another there:
# the inner one waits for the outer, which waits for its callback (plain
# JAX on CPU deadlocks the same way; issue 53 row 7).
NESTED = textwrap.dedent("""
    import json
    import jax_pathways
    jax_pathways.initialize()
    import jax, numpy as np
    from jax.experimental import io_callback
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    rows = NamedSharding(Mesh(np.array(jax.devices()[:2]), ("d",)), P("d"))
    inner = jax.jit(lambda v: v * 2)

    def callback(v):
      return np.asarray(inner(jax.device_put(np.asarray(v), rows)))

    x = jax.device_put(np.arange(8, dtype=np.float32), rows)
    y = jax.jit(lambda v: io_callback(
        callback, jax.ShapeDtypeStruct((8,), np.float32), v))(x)
    print(json.dumps({"launched": True}), flush=True)
    try:
      print(json.dumps({"value": np.asarray(y).tolist()}), flush=True)
    except Exception as e:
      print(json.dumps({"error": str(e)}), flush=True)
""")


@pytest.fixture(name="bounded", scope="module")
def _bounded():
  """2 islands of 2 devices, a program's run time bounded to 3 s."""
  from jax_pathways.cluster.local_cluster import LocalCluster  # pylint: disable=import-outside-toplevel
  with processes.running(LocalCluster(2, 2, 16, max_program_s=3)) as cluster:
    yield cluster


def test_a_program_past_the_owners_bound_gives_its_island_back(
    bounded, stopped, expected):
  other = _client(_env(bounded), OTHER)
  stopped.append(other)
  assert cli_cluster.line(other, 120) == {"ready": True}
  assert _ask(other, "keep") == {"value": expected}
  generation = _island0(bounded)["generation"]
  endless, _ = _endless_running(bounded)
  stopped.append(endless)
  # Island 1 (devices 2, 3) serves the other client while island 0 runs
  # the program.
  assert _ask(other, "compute 2") == {"value": expected}
  error = cli_cluster.line(endless, 120)["error"]
  assert "DATA_LOSS" in error, error
  assert "ran past the cluster's bound of 3 s" in error, error
  assert "taken back from program 'jit_" in error, error
  assert "host callback" not in error, error
  # The other client's array on island 0 went with the worker, and it
  # reads why; the island serves again.
  lost = _ask(other, "use")["error"]
  assert "ran past the cluster's bound of 3 s" in lost, lost
  _back(bounded, generation + 1)
  assert _ask(other, "compute 0") == {"value": expected}
  assert _ask(other, "compute 2") == {"value": expected}


def test_a_callback_waiting_on_its_own_island_is_named(bounded, stopped,
                                                       expected):
  """The bound ends the deadlock of row 7, and its error says where the
  program waited."""
  other = _client(_env(bounded), OTHER)
  stopped.append(other)
  assert cli_cluster.line(other, 120) == {"ready": True}
  generation = _island0(bounded)["generation"]
  nested = _client(_env(bounded), NESTED)
  stopped.append(nested)
  assert cli_cluster.line(nested, 120) == {"launched": True}
  error = cli_cluster.line(nested, 120)["error"]
  assert "ran past the cluster's bound of 3 s" in error, error
  assert "it waited in a host callback of its client" in error, error
  _back(bounded, generation + 1)
  assert _ask(other, "compute 0") == {"value": expected}


@pytest.fixture(name="cluster", scope="module")
def _cluster():
  from jax_pathways.cluster.local_cluster import LocalCluster  # pylint: disable=import-outside-toplevel
  with processes.running(LocalCluster(2, 1, 16)) as cluster:
    yield cluster


def _other_and_endless(cluster: Any, stopped: list[subprocess.Popen]
                       ) -> tuple[subprocess.Popen, int, subprocess.Popen,
                                  int]:
  """Another client, island 0's generation, and a client whose endless
  program runs there with its number."""
  other = _client(_env(cluster), OTHER)
  stopped.append(other)
  assert cli_cluster.line(other, 120) == {"ready": True}
  generation = _island0(cluster)["generation"]
  endless, number = _endless_running(cluster)
  stopped.append(endless)
  return other, generation, endless, number


def test_a_program_whose_client_died_gives_its_island_back(cluster, stopped,
                                                          expected):
  other, generation, endless, number = _other_and_endless(cluster, stopped)
  os.killpg(endless.pid, signal.SIGKILL)
  # Once another client's work waits behind the orphaned program, the
  # island is taken back: that work fails with why, and then runs again.
  error = _ask(other, "compute 0")["error"]
  assert f"of client {number}" in error, error
  assert "its client left" in error, error
  island = _back(cluster, generation + 1)
  assert "its client left" in island["last_lost"], island
  assert _ask(other, "compute 0") == {"value": expected}


def test_an_operator_cancels_a_client(cluster, stopped, expected):
  other, generation, endless, number = _other_and_endless(cluster, stopped)
  env = dict(_env(cluster), JAX_PATHWAYS_ADDRESS=cluster.controller_address)
  cancel = _cli(env, "cancel", "--client", str(number))
  assert cancel.returncode == 0, cancel.stderr
  assert f"client {number} ended" in cancel.stdout
  error = cli_cluster.line(endless, 120)["error"]
  assert "an operator cancelled its client (jax-pathways cancel)" in error
  island = _back(cluster, generation + 1)
  assert "an operator cancelled" in island["last_lost"], island
  assert _ask(other, "compute 0") == {"value": expected}
  # Its session is gone: `status` lists the other client only, and a
  # second cancel finds nobody.
  clients = [c["client"] for c in json.loads(
      _cli(env, "status", "--json").stdout)["clients"]]
  assert number not in clients, clients
  again = _cli(env, "cancel", "--client", str(number))
  assert again.returncode == 1
  assert f"no live client {number}" in again.stderr, again.stderr


def test_a_worker_stuck_in_the_program_leaves_by_itself(stopped):
  """Without a supervisor to kill it (a CLI worker; under k8s or Ray the
  orchestrator restarts what exits): the worker, its op loop inside the
  program, exits with the code that asks for a restart."""
  from jax_pathways.worker import join  # pylint: disable=import-outside-toplevel
  env = dict(os.environ, JAX_PATHWAYS_TOKEN="endless-test-token",
             JAX_PATHWAYS_MAX_PROGRAM_SECONDS="2")
  env.pop("JAX_PLATFORMS", None)
  ready = cli_cluster.start(env, 1, stopped, "--devices", "1")
  worker = stopped[-1]
  endless = _client(dict(env, JAX_PATHWAYS_ADDRESS=ready["address"]),
                    ENDLESS)
  stopped.append(endless)
  assert cli_cluster.line(endless, 120) == {"launched": True}
  error = cli_cluster.line(endless, 120)["error"]
  assert "ran past the cluster's bound of 2 s" in error, error
  assert worker.wait(60) == join.EXIT_LOST, cli_cluster.stderr_of(worker)
  assert "leaving without it" in worker.stderr.read()
