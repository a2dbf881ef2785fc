"""Programs spanning islands run again after a lost island rejoins: the
islands build a new generation of their global client (CLI cluster over TCP,
2 islands x 4 devices). A jit over all 8 devices gives the bits plain JAX
gives on 8 CPU devices before the loss, after a new worker took island 1's
place (the same jax.jit objects, fresh ones, and a program first compiled
after the rejoin) and after a second loss and rejoin (generation 2). Each
loss happens while a long program spanning both islands runs on them, so
the survivor has threads inside the lost worker's gloo collectives: a
SIGKILLed worker, and one stopped (SIGSTOP) past --worker-timeout, then
killed by the test once the new generation has run (until then the
survivor's threads in its collectives are stuck). Every process is stopped
by pid; every wait is bounded."""
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import cli_cluster  # tests/conftest.py puts tests/ on sys.path
import processes
from jax_pathways import admin

pytestmark = pytest.mark.integration

TOKEN = "global-rejoin-test-token"
WORKER_TIMEOUT_S = 2.0

# Float sums over all 8 devices (the rank-order rewrite keeps them bit for
# bit), shared by the client and the reference.
COMMON = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    SUM = "lambda x: jnp.sum(jnp.sin(x) * 1.7, axis=0)"
    LATER = "lambda x: jnp.sum(jnp.cos(x) * x, axis=0) / 3.0"
    a = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)

    def programs(mesh):
      psum = jax.jit(jax.shard_map(
          lambda b: jax.lax.psum(jnp.cos(b) * 0.3, "i"), mesh=mesh,
          in_specs=P("i"), out_specs=P()))
      return {"sum": jax.jit(eval(SUM)), "psum": psum}

    def run(fn, mesh):
      return np.asarray(fn(jax.device_put(a, NamedSharding(mesh, P("i")))))
""")

CLIENT = COMMON + textwrap.dedent("""
    import json, sys
    import jax_pathways
    jax_pathways.initialize(sys.argv[1], token=sys.argv[2])
    mesh = Mesh(np.array(jax.devices()), ("i",))
    jits = programs(mesh)
    long_runs = []

    def long(x):  # thousands of all-reduces: inside gloo when a worker goes
      return jax.lax.fori_loop(
          0, 20000, lambda _, b: b * 0.5 + jax.lax.psum(b, "i") / 16, x)

    long_jit = jax.jit(jax.shard_map(long, mesh=mesh, in_specs=P("i"),
                                     out_specs=P("i")))

    def say(**kw):
      print(json.dumps(kw), flush=True)

    def attempt(fn, *args):
      try:
        return {"value": np.asarray(fn(*args)).tobytes().hex()}
      except Exception as e:  # what the user would see
        return {"error": str(e)}

    # Made before any loss: it stays failed once island 1's worker is gone.
    kept = jax.device_put(a, NamedSharding(mesh, P("i")))
    say(ready=True)
    for line in sys.stdin:
      cmd = line.strip()
      if cmd == "call":  # the same jits, fresh ones, and a later program
        t = time.monotonic()
        first = attempt(run, jits["sum"], mesh)
        took = time.monotonic() - t
        say(sum=first, first_call_s=took,
            psum=attempt(run, jits["psum"], mesh),
            fresh_sum=attempt(run, jax.jit(eval(SUM)), mesh),
            fresh_psum=attempt(run, programs(mesh)["psum"], mesh),
            later=attempt(run, jax.jit(eval(LATER)), mesh),
            kept=attempt(jits["sum"], kept))
      elif cmd == "start_long":  # not waited for
        long_runs.append(long_jit(jax.device_put(
            a, NamedSharding(mesh, P("i")))))
        say(started=True)
      elif cmd == "quit":
        break
""").replace("import json, sys", "import json, sys, time")

REFERENCE = COMMON + textwrap.dedent("""
    import json
    mesh = Mesh(np.array(jax.devices()), ("i",))
    jits = programs(mesh)
    print(json.dumps({
        "sum": run(jits["sum"], mesh).tobytes().hex(),
        "psum": run(jits["psum"], mesh).tobytes().hex(),
        "later": run(jax.jit(eval(LATER)), mesh).tobytes().hex()}))
""")


def _reference(env):
  ref_env = dict(env, JAX_PLATFORMS="cpu",
                 XLA_FLAGS="--xla_force_host_platform_device_count=8")
  ref_env.pop("JAX_PATHWAYS_TOKEN")
  done = subprocess.run([sys.executable, "-c", REFERENCE], env=ref_env,
                        capture_output=True, text=True, timeout=120,
                        cwd=cli_cluster.CWD)
  assert done.returncode == 0, done.stderr[-2000:]
  return json.loads(done.stdout)


def _controller(islands, env, procs, tmp_path):
  """A controller of `islands` islands from the CLI, added to `procs`: its
  ready line and client address."""
  controller = cli_cluster.spawn(
      "controller", "--islands", str(islands), "--worker-timeout",
      str(WORKER_TIMEOUT_S), env=env,
      stderr=open(tmp_path / "controller.log", "w"))
  procs.append(controller)
  ready = cli_cluster.line(controller, 60)
  return ready, f"grpc://{ready['address']}"


def _log_lines(path, pattern):
  with open(path, errors="replace") as f:
    return [l.rstrip() for l in f if re.search(pattern, l)]


@pytest.mark.parametrize("how", ["sigkill", "sigstop"])
def test_spanning_programs_run_again_after_rejoins(how, tmp_path):
  env = dict(os.environ, JAX_PATHWAYS_TOKEN=TOKEN)
  env.pop("JAX_PLATFORMS", None)
  want = _reference(env)
  procs = []
  try:
    ready, address = _controller(2, env, procs, tmp_path)

    def worker(island, generation):
      log = tmp_path / f"worker{island}.{generation}.log"
      p = cli_cluster.spawn("worker", "--controller", ready["worker_address"],
                            "--island", str(island), "--devices", "4",
                            env=env, stderr=open(log, "w"))
      procs.append(p)
      return p

    worker(0, 0)
    victim = worker(1, 0)
    client_env = dict(env)
    client_env.pop("JAX_PATHWAYS_TOKEN")
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, address, TOKEN], env=client_env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=open(tmp_path / "client.log", "w"), text=True,
        start_new_session=True, cwd=cli_cluster.CWD)
    procs.append(client)
    assert cli_cluster.line(client, 120) == {"ready": True}

    def ask(cmd, timeout=120):
      client.stdin.write(cmd + "\n")
      client.stdin.flush()
      return cli_cluster.line(client, timeout)

    def check_bits(got):
      for key in ("sum", "psum"):
        assert got[key] == {"value": want[key]}, (key, got)
        assert got[f"fresh_{key}"] == {"value": want[key]}, (key, got)
      assert got["later"] == {"value": want["later"]}, got

    first = ask("call")
    check_bits(first)
    assert first["kept"] == {"value": want["sum"]}, first
    status = admin_status(address)
    assert status["global_client"]["generation"] == 0, status
    assert all(i["global_client"] for i in status["islands"]), status

    for generation in (1, 2):
      assert ask("start_long") == {"started": True}
      time.sleep(1.0)  # inside its collectives
      lost_at = time.monotonic()
      if how == "sigstop":
        processes.freeze(victim.pid)
      else:
        os.kill(victim.pid, signal.SIGKILL)
      cli_cluster.wait_for(
          "island 1 lost",
          lambda: not cli_cluster.island(address, TOKEN, 1)["alive"],
          WORKER_TIMEOUT_S + 10)
      noticed = time.monotonic() - lost_at
      gone = ask("call")
      assert "DATA_LOSS" in gone["sum"]["error"], gone
      assert not admin_status(address)["islands"][0]["global_client"]
      lost = victim
      victim = worker(1, generation)
      started = time.monotonic()
      cli_cluster.wait_for(
          "the new worker joined",
          lambda: (lambda i: i["alive"] and i["pid"] == victim.pid)(
              cli_cluster.island(address, TOKEN, 1)), 60)
      joined = time.monotonic()
      # At once, while the global client may still be built: the launch
      # waits for it (ordered behind it on every island).
      got = ask("call")
      first = time.monotonic()
      check_bits(got)
      assert "DATA_LOSS" in got["kept"]["error"], got
      status = admin_status(address)
      assert status["global_client"]["generation"] == generation, status
      assert status["global_client"]["state"] == "ready", status
      assert all(i["global_client"] for i in status["islands"]), status
      assert status["islands"][1]["generation"] == generation, status
      # A stopped worker stayed stopped until now: the survivor's threads
      # inside its collectives were stuck (gloo waits up to 30 minutes)
      # while the new generation ran.
      os.kill(lost.pid, signal.SIGKILL)
      lost.wait(timeout=10)
      print(f"{how} generation {generation}: loss noticed {noticed:.2f} s, "
            f"new worker started -> joined {joined - started:.2f} s, "
            f"joined -> first spanning call read back {first - joined:.2f} s"
            f" (that call {got['first_call_s']:.2f} s)")

    client.stdin.write("quit\n")
    client.stdin.flush()
    assert client.wait(timeout=30) == 0
  finally:
    processes.stop(procs)
  # What the survivor saw of the lost worker's collectives (gloo): reported
  # for the record, not asserted (timings vary).
  for line in _log_lines(tmp_path / "worker0.0.log",
                         r"side work failed|global client generation|lost"):
    print("worker 0:", line[:300])
  for line in _log_lines(tmp_path / "controller.log",
                         r"global client generation"):
    print("controller:", line[:300])



def admin_status(address):
  return admin.status(address, TOKEN)


# Over the islands given (sys.argv[3], "1,2"): a program summing a sharded
# array, a reshard of it, and the array assembled again from its shards,
# exact on integer-valued floats.
OVER = textwrap.dedent("""
    import json, sys
    import jax_pathways
    jax_pathways.initialize(sys.argv[1], token=sys.argv[2])
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    islands = {int(i) for i in sys.argv[3].split(",")}
    mesh = Mesh(np.array([d for d in jax.devices()
                          if d.slice_index in islands]), ("i",))
    a = np.arange(48 * 40, dtype=np.float32).reshape(48, 40) % 7
    x = jax.device_put(a, NamedSharding(mesh, P("i")))
    total = jax.jit(lambda v: jnp.sum(v, axis=0))(x)
    whole = jax.device_put(x, NamedSharding(mesh, P()))
    again = jax.make_array_from_single_device_arrays(
        a.shape, x.sharding, [s.data for s in x.addressable_shards])
    print(json.dumps({"sum_ok": bool((np.asarray(total) == a.sum(0)).all()),
                      "reshard_ok": bool((np.asarray(whole) == a).all()),
                      "assemble_ok": bool((np.asarray(again) == a).all())}))
""")
_OK = ("sum_ok", "reshard_ok", "assemble_ok")


def test_the_islands_left_after_a_loss_renumbered_run_spanning_programs(
    tmp_path):
  """Three islands, island 0's worker SIGKILLed: islands 1 and 2 build a
  global client of their own, in which they are processes 0 and 1 (they
  were 1 and 2), and programs spanning them, reshards and arrays
  assembled from shards give plain JAX's values."""
  env = dict(os.environ, JAX_PATHWAYS_TOKEN=TOKEN)
  env.pop("JAX_PLATFORMS", None)
  client_env = dict(env)
  client_env.pop("JAX_PATHWAYS_TOKEN")
  procs = []

  def over(islands):
    done = subprocess.run([sys.executable, "-c", OVER, address, TOKEN,
                           islands], env=client_env, capture_output=True,
                          text=True, timeout=120, cwd=cli_cluster.CWD)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])

  try:
    ready, address = _controller(3, env, procs, tmp_path)
    workers = [cli_cluster.spawn(
        "worker", "--controller", ready["worker_address"], "--island",
        str(i), "--devices", "2", env=env,
        stderr=open(tmp_path / f"worker{i}.log", "w")) for i in range(3)]
    procs.extend(workers)
    assert over("0,1,2") == dict.fromkeys(_OK, True)
    os.kill(workers[0].pid, signal.SIGKILL)
    cli_cluster.wait_for(
        "island 0 lost",
        lambda: not cli_cluster.island(address, TOKEN, 0)["alive"],
        WORKER_TIMEOUT_S + 10)
    assert over("1,2") == dict.fromkeys(_OK, True)
    status = admin.status(address, TOKEN)
    assert status["global_client"]["generation"] == 1, status
  finally:
    processes.stop(procs)
