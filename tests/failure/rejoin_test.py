"""A lost island rejoins: a new worker started by hand with the same
`--island` takes its place (CLI cluster over TCP with a token, as on real
hosts). The island's programs run there again, bit for bit as plain JAX;
arrays of the old worker stay failed with DATA_LOSS naming it; `status`
shows the restart and the loss; programs spanning both islands run again
(tests/failure/global_rejoin_test.py checks them bit for bit). Every
process is stopped by pid."""
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import cli_cluster  # tests/conftest.py puts tests/ on sys.path
from cli_cluster import CWD, line as _line, spawn as _spawn
from cli_cluster import wait_for as _wait_for
import processes

pytestmark = pytest.mark.integration

TOKEN = "rejoin-test-token"

# What the client and the reference both compute on one device.
FN = "lambda a: jnp.sin(a) * 2.5 + jnp.cumsum(a) / 3.0"

# Driven over stdin: one command a line, one JSON answer a line.
CLIENT = textwrap.dedent(f"""
    import json, sys
    import jax_pathways
    jax_pathways.initialize(sys.argv[1], token=sys.argv[2])
    import jax, jax.numpy as jnp, numpy as np
    devices = jax.devices()
    f = jax.jit({FN})
    a = np.linspace(-3, 3, 64, dtype=np.float32)

    def say(**kw):
      print(json.dumps(kw), flush=True)

    def attempt(fn):
      try:
        return {{"value": np.asarray(fn()).tobytes().hex()}}
      except Exception as e:  # what the user would see
        return {{"error": str(e)}}

    def spanning():  # a program over both islands
      mesh = Mesh(np.array(devices), ("i",))
      x = jax.device_put(np.ones((4, 8), np.float32),
                         NamedSharding(mesh, P("i")))
      return jax.jit(lambda x: x * 2)(x)

    old = jax.device_put(a, devices[2])           # island 1, old worker
    before = f(old)                               # not read before the loss
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    # A view (a shard of an island-1 array): no memory of its own.
    view = jax.device_put(a, NamedSharding(Mesh(np.array(devices[2:4]), ("i",)),
                                           P("i"))).addressable_shards[0].data
    f(jax.device_put(a, devices[0])).block_until_ready()  # island 0
    # Links between the workers, both ways, before the loss.
    jax.device_put(jax.device_put(jax.device_put(a, devices[0]), devices[2]),
                   devices[1]).block_until_ready()
    say(ready=True)
    for line in sys.stdin:
      cmd = line.strip()
      if cmd == "after_loss":
        say(read_old=attempt(lambda: before),
            use_old=attempt(lambda: f(old)),
            island0=attempt(lambda: f(jax.device_put(a, devices[0]))))
      elif cmd == "after_rejoin":
        new = jax.device_put(a, devices[2])
        say(same_jit=attempt(lambda: f(new)),
            new_jit=attempt(lambda: jax.jit(lambda x: x * 3 - 1)(new)),
            read_old=attempt(lambda: before),
            use_old=attempt(lambda: f(old)),
            use_view=attempt(lambda: f(view)),
            # Moves between the new worker and an old one, both ways.
            moved=attempt(lambda: jax.device_put(
                jax.device_put(f(new), devices[0]), devices[3])),
            island0=attempt(lambda: f(jax.device_put(a, devices[0]))),
            spanning=attempt(spanning))
      elif cmd == "quit":
        break
""")

REFERENCE = textwrap.dedent(f"""
    import jax, jax.numpy as jnp, numpy as np
    a = np.linspace(-3, 3, 64, dtype=np.float32)
    print(np.asarray(jax.jit({FN})(a)).tobytes().hex())
    print(np.asarray(jax.jit(lambda x: x * 3 - 1)(a)).tobytes().hex())
""")


@contextlib.contextmanager
def _stopped_at_end():
  procs = []
  try:
    yield procs
  finally:
    processes.stop(procs)


def _island(address, number):
  return cli_cluster.island(address, TOKEN, number)


def test_new_worker_takes_a_lost_islands_place():
  env = dict(os.environ, JAX_PATHWAYS_TOKEN=TOKEN)
  env.pop("JAX_PLATFORMS", None)
  ref_env = dict(env, JAX_PLATFORMS="cpu")
  ref_env.pop("JAX_PATHWAYS_TOKEN")
  reference = subprocess.run([sys.executable, "-c", REFERENCE], env=ref_env,
                             capture_output=True, text=True, timeout=120,
                             cwd=CWD)
  assert reference.returncode == 0, reference.stderr[-2000:]
  want_f, want_g = reference.stdout.split()

  with _stopped_at_end() as procs:
    controller = _spawn("controller", "--islands", "2", "--listen",
                        "127.0.0.1:0", "--worker-listen", "127.0.0.1:0",
                        env=env)
    procs.append(controller)
    ready = _line(controller, 60)
    address = f"grpc://{ready['address']}"

    def worker():
      p = _spawn("worker", "--controller", ready["worker_address"],
                 "--island", "1", "--devices", "2", env=env)
      procs.append(p)
      return p

    procs.append(_spawn("worker", "--controller", ready["worker_address"],
                        "--island", "0", "--devices", "2", env=env))
    old_worker = worker()
    client_env = dict(env)
    client_env.pop("JAX_PATHWAYS_TOKEN")
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, address, TOKEN], env=client_env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True, cwd=CWD)
    procs.append(client)
    assert _line(client, 120) == {"ready": True}

    def ask(cmd):
      client.stdin.write(cmd + "\n")
      client.stdin.flush()
      return _line(client, 60)

    killed_at = time.monotonic()
    os.kill(old_worker.pid, signal.SIGKILL)
    old_worker.wait(timeout=10)
    _wait_for("island 1 lost",
              lambda: not _island(address, 1)["alive"], 10)
    lost = ask("after_loss")
    for key in ("read_old", "use_old"):
      assert "DATA_LOSS" in lost[key]["error"], lost
      assert f"pid {old_worker.pid}" in lost[key]["error"], lost
    assert lost["island0"] == {"value": want_f}, lost

    new_worker = worker()
    joined = _wait_for(
        "the new worker joined",
        lambda: (lambda i: i if i["alive"] and i["pid"] == new_worker.pid
                 else None)(_island(address, 1)), 60)
    joined_at = time.monotonic()
    after = ask("after_rejoin")
    first_ok_at = time.monotonic()
    # The client's executable from before the loss, compiled again on the
    # new worker, and a program compiled after: bit for bit as plain JAX.
    assert after["same_jit"] == {"value": want_f}, after
    assert after["new_jit"] == {"value": want_g}, after
    assert after["moved"] == {"value": want_f}, after
    for key in ("read_old", "use_old", "use_view"):
      assert "DATA_LOSS" in after[key]["error"], after
      assert f"pid {old_worker.pid}" in after[key]["error"], after
    assert after["island0"] == {"value": want_f}, after
    # Every island has a worker again: they share a new global client.
    assert after["spanning"] == {
        "value": np.full((4, 8), 2, np.float32).tobytes().hex()}, after

    assert joined["restarts"] == 1 and joined["generation"] == 1, joined
    assert f"pid {old_worker.pid}" in joined["last_lost"], joined
    assert joined["last_lost_at"] > 0 and not joined["error"], joined
    shown = subprocess.run(
        [sys.executable, "-m", "jax_pathways.cli", "status", "--address",
         address], env=env, capture_output=True, text=True, timeout=60,
        cwd=CWD)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "restarts 1, last lost" in shown.stdout, shown.stdout
    assert "global client generation 1: ready" in shown.stdout, shown.stdout
    print(f"kill -> rejoined {joined_at - killed_at:.2f} s (worker start "
          f"included), rejoined -> first island-1 jits read back "
          f"{first_ok_at - joined_at:.2f} s")
    client.stdin.write("quit\n")
    client.stdin.flush()
    assert client.wait(timeout=30) == 0, (
        cli_cluster.stderr_of(client)[-3000:])


RESTART_VICTIM = os.path.join(os.path.dirname(__file__), "restart_victim.py")


@pytest.mark.parametrize("restart", [True, False], ids=["restart", "off"])
def test_embedded_cluster_restarts_a_dead_worker(restart):
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)
  client = subprocess.Popen(
      [sys.executable, RESTART_VICTIM, "restart" if restart else "no-restart"],
      env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, start_new_session=True)
  pids = []
  pinned: dict[int, int | None] = {}  # pid -> its pidfd (processes.pin)
  try:
    start = _line(client, 120)
    pids = [start["controller"], *start["workers"]]
    pinned.update((p, processes.pin(p)) for p in pids)

    def ask(cmd):
      client.stdin.write(cmd + "\n")
      client.stdin.flush()
      return _line(client, 60)

    victim = start["workers"][1]
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    if restart:
      def back():
        s = ask("status")
        island = s["islands"][1]
        if island["alive"] and island["pid"] != victim:
          return s
        return None
      status = _wait_for("the supervisor restarted island 1", back, 60)
      rejoined_at = time.monotonic()
      new = status["workers"][1]
      pids.append(new)
      pinned[new] = processes.pin(new)
      assert new != victim and status["restarts"] == [0, 1], status
      assert status["islands"][1]["pid"] == new
      assert status["islands"][1]["restarts"] == 1
      assert f"pid {victim}" in status["islands"][1]["last_lost"]
      assert ask("compute") == {"same": True}
      print(f"kill -> restarted and rejoined {rejoined_at - killed_at:.2f} s,"
            f" -> first jit read back {time.monotonic() - rejoined_at:.2f} s")
    else:
      time.sleep(3)  # what a restart would take
      status = ask("status")
      assert status["workers"][1] == victim and status["restarts"] == [0, 0]
      assert not status["islands"][1]["alive"], status
      got = ask("compute")
      assert "DATA_LOSS" in got["error"] and f"pid {victim}" in got["error"]
    pids = status["pids"]
    pinned.update((p, processes.pin(p)) for p in pids if p not in pinned)
    client.stdin.write("quit\n")
    client.stdin.flush()
    assert _line(client, 30) == {"done": True}
    assert client.wait(timeout=30) == 0, client.stderr.read()[-3000:]
    # Every process the cluster started, restarted ones too, ends with it.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not all(
        processes.ended(pinned[p]) for p in pids):
      time.sleep(0.1)
    assert all(processes.ended(pinned[p]) for p in pids), pids
  finally:
    if client.poll() is None:
      client.kill()
      client.wait(timeout=10)
    for fd in pinned.values():
      processes.send(fd, signal.SIGKILL)
      if fd is not None:
        os.close(fd)
