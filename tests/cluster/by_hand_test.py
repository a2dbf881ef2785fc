"""A cluster started by hand, as on real hosts: controller and workers from
the CLI over TCP with a token, a client joining by address."""
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import grpc
import jax
import numpy as np
import pytest

from jax_pathways import _core
from jax_pathways import admin
from jax_pathways.cluster import addresses
from jax_pathways.wire import handshake

import processes  # tests/conftest.py puts tests/ on sys.path

pytestmark = pytest.mark.integration

# Subprocesses start outside the checkout: `python -m` / `-c` would import
# its unbuilt sources instead of the installed package.
CWD = tempfile.gettempdir()

TOKEN = "by-hand-test-token"


def _spawn(*args, env=None):
  return subprocess.Popen([sys.executable, "-m", "jax_pathways.cli", *args],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=env, text=True, start_new_session=True,
                          cwd=CWD)


def _ready_line(proc, timeout=60):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if select.select([proc.stdout], [], [], 0.2)[0]:
      return json.loads(proc.stdout.readline())
    assert proc.poll() is None, proc.stderr.read()[-2000:]
  raise AssertionError("controller did not start")


@contextlib.contextmanager
def _started(env, *controller_args, islands=2):
  """A controller and its workers from the CLI; all stopped by pid."""
  procs = []
  try:
    controller = _spawn("controller", "--islands", str(islands), "--listen",
                        "127.0.0.1:0", "--worker-listen", "127.0.0.1:0",
                        *controller_args, env=env)
    procs.append(controller)
    ready = _ready_line(controller)
    for island in reversed(range(islands)):  # any order
      procs.append(_spawn("worker", "--controller", ready["worker_address"],
                          "--island", str(island), "--devices", "2", env=env))
    yield ready
  finally:
    processes.stop(procs)


@pytest.fixture
def cluster():
  env = dict(os.environ, JAX_PATHWAYS_TOKEN=TOKEN)
  env.pop("JAX_PLATFORMS", None)
  with _started(env) as ready:
    yield ready, env


CLIENT = textwrap.dedent("""
    import sys, json
    import jax_pathways
    jax_pathways.initialize(sys.argv[1], token=sys.argv[2])
    import jax, numpy as np
    devices = jax.devices()
    x = jax.device_put(np.arange(6.0), devices[3])      # island 1
    y = jax.jit(lambda a: a * 2)(x)
    z = jax.device_put(y, devices[0])                   # back to island 0
    print(json.dumps({"n": len(devices),
                      "islands": [d.slice_index for d in devices],
                      "z": np.asarray(z).tolist()}))
""")


def _client(address, token, env=None, script=CLIENT):
  env = dict(os.environ if env is None else env)
  env.pop("JAX_PLATFORMS", None)
  env.pop("JAX_PATHWAYS_TOKEN", None)
  return subprocess.run([sys.executable, "-c", script, f"grpc://{address}",
                         token], env=env, capture_output=True, text=True,
                        timeout=120, cwd=CWD)


def _joined(ready) -> str:
  """The cluster's admin address, once every island's worker has joined."""
  address = f"grpc://{ready['address']}"
  deadline = time.monotonic() + 60
  while not admin.status(address, TOKEN)["complete"]:
    assert time.monotonic() < deadline, "the workers did not join"
    time.sleep(0.2)
  return address


def test_client_joins_by_address(cluster):
  ready, env = cluster
  out = _client(ready["address"], TOKEN)
  assert out.returncode == 0, out.stderr[-3000:]
  got = json.loads(out.stdout.strip().splitlines()[-1])
  assert got == {"n": 4, "islands": [0, 0, 1, 1],
                 "z": [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]}
  status = subprocess.run(
      [sys.executable, "-m", "jax_pathways.cli", "status", "--address",
       f"grpc://{ready['address']}", "--json"], env=env, capture_output=True,
      text=True, timeout=60, cwd=CWD)
  assert status.returncode == 0, status.stderr
  islands = json.loads(status.stdout)["islands"]
  assert [i["devices"] for i in islands] == [[0, 1], [2, 3]]


UPLOADS = textwrap.dedent("""
    import sys, json
    import jax_pathways
    address, token = sys.argv[1:]
    jax_pathways.initialize(address, token=token)
    import jax, numpy as np
    from jax_pathways import admin

    def islands():
      return admin.status(address, token)["islands"]

    puts = []
    for seed in range(3):
      x = np.random.default_rng(seed).standard_normal(4 << 20).astype(
          np.float32)
      before = sum(i["staged_bytes"] for i in islands())
      y = jax.device_put(x, jax.devices()[seed % 2 * 2])  # islands 0, 1, 0
      puts.append({"whole": bool((np.asarray(y) == x).all()),
                   "staged": sum(i["staged_bytes"] for i in islands()) -
                             before})
    print(json.dumps({"puts": puts, "nbytes": x.nbytes,
                      "reads_locally": [i["reads_locally"]
                                        for i in islands()]}))
""")


def test_large_uploads_stream_to_workers_elsewhere(cluster):
  """Workers over TCP (as on other hosts) are sent a large upload's bytes
  while it arrives; each array arrives whole (an upload all in before the
  controller handles its request, which a loaded machine may make of one,
  has nothing to stream)."""
  ready, _ = cluster
  out = _client(ready["address"], TOKEN, script=UPLOADS)
  assert out.returncode == 0, out.stderr[-3000:]
  got = json.loads(out.stdout.strip().splitlines()[-1])
  assert got["reads_locally"] == [False, False]
  assert all(p["whole"] for p in got["puts"]), got
  streamed = [p["staged"] for p in got["puts"]]
  assert set(streamed) <= {0, got["nbytes"]} and got["nbytes"] in streamed, (
      got)


FROZEN = textwrap.dedent("""
    import sys, json
    import jax_pathways
    address, token = sys.argv[1:]
    jax_pathways.initialize(address, token=token)
    import jax, numpy as np
    x = np.arange(4 << 20, dtype=np.float32)
    out = {}
    try:
      np.asarray(jax.device_put(x, jax.devices()[0]))  # island 0's
      out["frozen"] = "no error"
    except Exception as e:  # pylint: disable=broad-except
      out["frozen"] = str(e)
    y = jax.device_put(x, jax.devices()[2])  # island 1's
    out["island1_whole"] = bool((np.asarray(y) == x).all())
    print(json.dumps(out))
""")


def test_an_upload_streaming_to_a_frozen_worker_fails_it_alone(cluster):
  """A worker elsewhere that stops reading (SIGSTOP) while a large upload
  streams to it: the bytes queue in the controller (never blocking its
  gRPC thread), the worker is lost after its timeout and the upload fails
  saying so; the other island's uploads go on."""
  ready, _ = cluster
  address = _joined(ready)
  # Both workers serve ops, so they are past building the islands' global
  # client: a worker stopped during that stalls the others' join
  # (docs/limitations.md), which is not what this test is about.
  served = _client(ready["address"], TOKEN)
  assert served.returncode == 0, served.stderr[-3000:]
  victim = {i["island"]: i for i in admin.status(address, TOKEN)["islands"]}[
      0]["pid"]
  processes.freeze(victim)
  try:
    out = _client(ready["address"], TOKEN, script=FROZEN)
  finally:
    os.kill(victim, signal.SIGCONT)  # it finds itself lost, and exits
  assert out.returncode == 0, out.stderr[-3000:]
  got = json.loads(out.stdout.strip().splitlines()[-1])
  assert f"pid {victim}" in got["frozen"], got
  assert "island 0" in got["frozen"], got
  # Declared lost by its silence while still stopped (it is resumed only
  # after the client is done), not after a resume.
  assert "--worker-timeout" in got["frozen"], got
  assert got["island1_whole"] is True
  islands = {i["island"]: i for i in admin.status(address, TOKEN)["islands"]}
  assert not islands[0]["alive"] and islands[1]["alive"]


def _silent_worker(worker_address: str, island: int) -> socket.socket:
  """A worker that joins the controller, then does nothing: it never
  builds the islands' global client with the others (nor heartbeats), as
  one stopped right after its handshake would."""
  sock = addresses.connect(worker_address, 10)
  handshake.connect(sock, TOKEN, {
      "role": "worker", "island": island, "num_devices": 2,
      "memory_bytes": 1 << 30, "platform": "cpu", "device_kind": "cpu",
      "pid": 0, "host": socket.gethostname(), "data_address": "127.0.0.1:1",
      "transfer_address": "", "wire_version": _core.WIRE_VERSION,
      "jax_version": jax.__version__}, timeout=10)
  return sock


ISLAND_0 = textwrap.dedent("""
    import sys, json
    import jax_pathways
    jax_pathways.initialize(sys.argv[1], token=sys.argv[2])
    import jax, numpy as np
    x = jax.device_put(np.arange(6.0), jax.devices()[0])
    print(json.dumps({"y": np.asarray(jax.jit(lambda a: a * 2 + 1)(x))
                      .tolist()}))
""")

SPANNING = textwrap.dedent("""
    import sys, json
    import jax_pathways
    jax_pathways.initialize(sys.argv[1], token=sys.argv[2])
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()), ("x",))
    x = jax.device_put(np.arange(8.0), NamedSharding(mesh, P("x")))
    print(json.dumps({"sum": float(jax.jit(lambda a: a.sum())(x))}))
""")


def _island(address: str, island: int) -> dict:
  return {i["island"]: i for i in admin.status(address, TOKEN)["islands"]}[
      island]


def test_a_worker_lost_while_the_islands_first_join_stalls_no_one():
  """An island's worker that never builds the islands' first global client
  (stopped right after joining the controller): a program spanning the
  islands fails with its loss, the other island serves its own programs
  (its wait for the build ended with the loss), and once a new worker
  takes the lost one's place the islands build the next generation and
  programs spanning them run. (At 55ba8a1 the other worker waited in that
  first join, before running any op, for up to 120 s, then exited.)"""
  env = dict(os.environ, JAX_PATHWAYS_TOKEN=TOKEN)
  env.pop("JAX_PLATFORMS", None)
  procs = []
  silent = None
  try:
    controller = _spawn("controller", "--islands", "2", "--listen",
                        "127.0.0.1:0", "--worker-listen", "127.0.0.1:0",
                        "--worker-timeout", "3", env=env)
    procs.append(controller)
    ready = _ready_line(controller)
    silent = _silent_worker(ready["worker_address"], 1)
    procs.append(_spawn("worker", "--controller", ready["worker_address"],
                        "--island", "0", "--devices", "2", env=env))
    address = _joined(ready)
    # Island 0's worker waits for the global client's build to compile
    # it; island 1 is lost after its --worker-timeout, and the program
    # fails saying so.
    out = _client(ready["address"], TOKEN, script=SPANNING)
    assert out.returncode != 0
    assert "island 1" in out.stderr and "is lost" in out.stderr, (
        out.stderr[-3000:])
    assert not _island(address, 1)["alive"]
    # Island 0's worker did not wait on for the build: it serves.
    out = _client(ready["address"], TOKEN, script=ISLAND_0)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["y"] == (np.arange(6.0) * 2 + 1).tolist()
    silent.close()
    procs.append(_spawn("worker", "--controller", ready["worker_address"],
                        "--island", "1", "--devices", "2", env=env))
    deadline = time.monotonic() + 60
    while not _island(address, 1)["alive"]:
      assert time.monotonic() < deadline, "no worker took island 1's place"
      time.sleep(0.2)
    out = _client(ready["address"], TOKEN, script=SPANNING)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["sum"] == np.arange(8.0).sum()
    # The generation spanning both is ready: the first one if island 0's
    # worker joined only after island 1 was lost (a loaded machine), else
    # the next.
    status = admin.status(address, TOKEN)
    assert status["global_client"]["state"] == "ready", status
    assert _island(address, 0)["generation"] == 0  # never restarted
  finally:
    if silent is not None:
      silent.close()
    processes.stop(procs)


UPLOADING = textwrap.dedent("""
    import sys
    import jax_pathways
    jax_pathways.initialize(sys.argv[1], token=sys.argv[2])
    import jax, numpy as np
    x = np.ones(16 << 20, dtype=np.float32)  # 64 MB
    while True:
      jax.device_put(x, jax.devices()[0]).block_until_ready()
""")


def test_a_client_killed_mid_upload_leaves_no_stage(cluster):
  """kill -9 a client while its upload streams to a worker elsewhere: the
  worker's room for the stage is given back once the controller sees the
  client go, and the cluster serves the next client."""
  ready, _ = cluster
  address = _joined(ready)
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)
  env.pop("JAX_PATHWAYS_TOKEN", None)
  client = subprocess.Popen(
      [sys.executable, "-c", UPLOADING, address, TOKEN], env=env,
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
      start_new_session=True, cwd=CWD)

  def held() -> int:
    return {i["island"]: i for i in admin.status(address, TOKEN)[
        "islands"]}[0]["held_stage_bytes"]

  try:
    deadline = time.monotonic() + 90
    while held() == 0:  # a stage open: an upload on its way
      assert client.poll() is None, client.stderr.read()[-3000:]
      assert time.monotonic() < deadline, "no upload streamed"
      time.sleep(0.01)
    os.kill(client.pid, signal.SIGKILL)
  finally:
    processes.stop([client])
  deadline = time.monotonic() + 10
  while held() != 0:
    assert time.monotonic() < deadline, "the stage outlived its client"
    time.sleep(0.05)
  out = _client(ready["address"], TOKEN)
  assert out.returncode == 0, out.stderr[-3000:]
  islands = admin.status(address, TOKEN)["islands"]
  assert all(i["alive"] for i in islands), islands


def test_wrong_token_is_refused(cluster):
  ready, _ = cluster
  out = _client(ready["address"], "not-the-token")
  assert out.returncode != 0
  assert "refused this process's cluster token" in out.stderr, out.stderr[-2000:]


def test_admin_calls_need_the_token(cluster):
  ready, _ = cluster
  address = f"grpc://{ready['address']}"
  for call in (lambda t: admin.status(address, t),
               lambda t: admin.trace(address, "start", t)):
    with pytest.raises(admin.AdminError, match="UNAUTHENTICATED") as e:
      call("not-the-token")
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
  assert admin.status(address, TOKEN)["expected_islands"] == 2


def test_worker_with_wrong_token_is_refused(cluster):
  ready, env = cluster
  bad = subprocess.run(
      [sys.executable, "-m", "jax_pathways.cli", "worker", "--controller",
       ready["worker_address"], "--devices", "1", "--connect-timeout", "10"],
      env=dict(env, JAX_PATHWAYS_TOKEN="guess"), capture_output=True,
      text=True, timeout=60, cwd=CWD)
  assert bad.returncode == 2
  assert "wrong cluster token" in bad.stderr


def _status(ready, env):
  return subprocess.run(
      [sys.executable, "-m", "jax_pathways.cli", "status", "--address",
       f"grpc://{ready['address']}", "--json"], env=env, capture_output=True,
      text=True, timeout=60, cwd=CWD)


def test_a_controller_without_a_token_makes_one(tmp_path):
  # At 385bf6b a controller without JAX_PATHWAYS_TOKEN accepted any local
  # process.
  env = dict(os.environ, JAX_PATHWAYS_TOKEN_FILE=str(tmp_path / "t" / "token"))
  env.pop("JAX_PATHWAYS_TOKEN", None)
  env.pop("JAX_PLATFORMS", None)
  with _started(env, islands=1) as ready:
    # Workers and `status` on this host find the token in the file.
    status = _status(ready, env)
    assert status.returncode == 0, status.stderr[-2000:]
    deadline = time.monotonic() + 60
    while not json.loads(status.stdout)["complete"]:
      assert time.monotonic() < deadline, "the worker did not join"
      time.sleep(0.2)
      status = _status(ready, env)
    token_file = tmp_path / "t" / "token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "t").stat().st_mode & 0o777 == 0o700
    token = token_file.read_text().strip()
    assert len(token) == 32
    # Without it: refused.
    elsewhere = dict(env, JAX_PATHWAYS_TOKEN_FILE=str(tmp_path / "none"))
    refused = _status(ready, elsewhere)
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr
    out = _client(ready["address"], "", elsewhere)
    assert out.returncode != 0
    assert "refused this process's cluster token" in out.stderr, (
        out.stderr[-2000:])
    assert admin.status(f"grpc://{ready['address']}", token)["complete"]


def test_insecure_is_for_loopback_only():
  env = dict(os.environ)
  env.pop("JAX_PATHWAYS_TOKEN", None)
  out = subprocess.run(
      [sys.executable, "-m", "jax_pathways.cli", "controller", "--islands",
       "1", "--listen", "0.0.0.0:0", "--insecure"], env=env,
      capture_output=True, text=True, timeout=60, cwd=CWD)
  assert out.returncode != 0
  assert "--insecure: refusing to listen on 0.0.0.0:0" in out.stderr


def test_a_worker_joining_islands_leaves_when_its_controller_dies():
  """A worker waiting in the join for an island that never comes, whose
  controller is SIGKILLed, exits with 0 (gone: a restart could not join
  either), not with a failure a restart policy would retry forever."""
  env = dict(os.environ, JAX_PATHWAYS_TOKEN=TOKEN)
  procs = []
  try:
    controller = _spawn("controller", "--islands", "2", "--listen",
                        "127.0.0.1:0", "--worker-listen", "127.0.0.1:0",
                        env=env)
    procs.append(controller)
    ready = _ready_line(controller)
    worker = _spawn("worker", "--controller", ready["worker_address"],
                    "--island", "0", "--devices", "1", "--controller-timeout",
                    "2", env=env)
    procs.append(worker)
    deadline = time.monotonic() + 60
    while not admin.status(f"grpc://{ready['address']}", TOKEN)["islands"]:
      assert time.monotonic() < deadline and worker.poll() is None
      time.sleep(0.2)
    controller.kill()
    assert worker.wait(timeout=30) == 0, worker.stderr.read()[-2000:]
    stderr = worker.stderr.read()
    assert "controller is gone" in stderr, stderr[-2000:]
  finally:
    processes.stop(procs)
