"""A pipeline stage's worker stopped (SIGSTOP) or killed mid-step, on a
cluster with no supervisor to kill a stopped one (CLI processes over TCP,
as on real hosts): the surviving island it exchanges with is not held by
it. The step over the lost island fails with DATA_LOSS naming its worker
once the controller declares it lost (--worker-timeout); a pipeline over
the survivor and a third island gives the bits it gave before, and keeps
running. Moves pulled through the transfer servers (Shardy's small ones)
and pushed over the peer links (the own splitter's, and large ones) alike.
Before, the survivor's device waited for the pulled bytes, its op loop for
pushed ones and its sends thread on a full socket, for up to 300 s (then
its watchdog made it exit too). Every process is stopped by pid; every
wait is bounded."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import cli_cluster  # tests/conftest.py puts tests/ on sys.path
import processes

pytestmark = pytest.mark.integration

TOKEN = "lost-stage-test-token"
WORKER_TIMEOUT_S = 2.0
MPMD_TESTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "mpmd")

CLIENT = textwrap.dedent("""
    import hashlib, json, sys, threading, time
    import jax_pathways
    jax_pathways.initialize(sys.argv[1], token=sys.argv[2])
    sys.path.insert(0, sys.argv[3])
    import jax
    from jax_pathways import mpmd
    import models

    def pipeline(model, islands, partitioner):
      return mpmd.pipeline(
          model.train_step, mpmd.Topology.islands(islands, devices_per_mesh=1),
          stages={"s0": islands[0], "s1": islands[1]}, schedule="1F1B",
          microbatches=4, batch_argnums=(1,), partitioner=partitioner)

    def run(model, step):
      try:
        params, loss = step(model.params, (model.x, model.y))
        leaves = [jax.device_get(x) for x in [loss, *jax.tree.leaves(params)]]
        return {"digest": hashlib.sha256(
            b"".join(x.tobytes() for x in leaves)).hexdigest()}
      except Exception as e:  # what the user would see
        return {"error": f"{type(e).__name__}: {e}"}

    def say(**kw):
      print(json.dumps(kw), flush=True)

    # Steps over islands 0 and 1, "partitioner:batch" each; one over 0 and 2.
    steps = {}
    for spec in sys.argv[4:]:
      partitioner, batch = spec.split(":")
      model = models.make_mlp(stages=2, microbatches=4, batch=int(batch))
      steps[spec] = (model, pipeline(model, [0, 1], partitioner))
    small = models.make_mlp(stages=2, microbatches=4)
    other = (small, pipeline(small, [0, 2], "auto"))
    say(steps={spec: run(*step) for spec, step in steps.items()},
        other=run(*other),
        partitioners=[step[1].partitioner for step in steps.values()])
    sys.stdin.readline()  # island 1's worker is stopped or killed now
    got = {}
    threads = [threading.Thread(target=lambda s=spec: got.update(
                   {s: run(*steps[s])}), daemon=True) for spec in steps]
    for thread in threads:
      thread.start()
    time.sleep(0.5)  # their moves are on island 0's worker
    say(other=run(*other))
    for thread in threads:
      thread.join()
    say(steps=got, other=run(*other))
""")

# Pulled through the transfer servers (Shardy's small moves); pushed over
# the peer links (the own splitter's); 16 MiB between stages, pushed, more
# than the socket takes before a stopped peer reads (the survivor's sends
# wait on it).
IN_FLIGHT = ["shardy:8", "jax_pathways:8", "shardy:131072"]


@pytest.mark.parametrize("how", [signal.SIGSTOP, signal.SIGKILL],
                         ids=["stopped", "killed"])
def test_a_lost_stage_holds_no_survivor(how):
  env = dict(os.environ, JAX_PATHWAYS_TOKEN=TOKEN)
  env.pop("JAX_PLATFORMS", None)
  procs: list[subprocess.Popen] = []
  try:
    controller = cli_cluster.spawn(
        "controller", "--islands", "3", "--listen", "127.0.0.1:0",
        "--worker-listen", "127.0.0.1:0", "--worker-timeout",
        str(WORKER_TIMEOUT_S), env=env)
    procs.append(controller)
    ready = cli_cluster.line(controller, 60)
    workers = []
    for island in range(3):
      workers.append(cli_cluster.spawn(
          "worker", "--controller", ready["worker_address"], "--island",
          str(island), "--devices", "1", env=env, stderr=subprocess.DEVNULL))
    procs.extend(workers)
    client_env = dict(env)
    client_env.pop("JAX_PATHWAYS_TOKEN")
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, f"grpc://{ready['address']}", TOKEN,
         MPMD_TESTS, *IN_FLIGHT], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=client_env, start_new_session=True, cwd=cli_cluster.CWD)
    procs.append(client)
    before = cli_cluster.line(client, 240)
    assert before["partitioners"] == [s.split(":")[0] for s in IN_FLIGHT]
    assert all("digest" in got for got in before["steps"].values()), before
    assert "digest" in before["other"], before

    if how == signal.SIGSTOP:
      processes.freeze(workers[1].pid)
    else:
      os.kill(workers[1].pid, how)
    client.stdin.write("go\n")
    client.stdin.flush()
    # Held at most until island 1 is declared lost (WORKER_TIMEOUT_S), not
    # for RECEIVE_TIMEOUT_S or the survivor's 300 s watchdog.
    meanwhile = cli_cluster.line(client, 60)
    assert meanwhile["other"] == before["other"], meanwhile
    after = cli_cluster.line(client, 60)
    for spec in IN_FLIGHT:
      error = after["steps"][spec].get("error", "")
      assert error.startswith("JaxRuntimeError: DATA_LOSS"), (spec, after)
      assert f"island 1 (worker pid {workers[1].pid} " in error, (spec, after)
    assert after["other"] == before["other"], after
    assert workers[0].poll() is None and workers[2].poll() is None
    client.stdin.close()
    assert client.wait(timeout=30) == 0, cli_cluster.stderr_of(client)[-3000:]
  finally:
    for p in procs:
      if p.poll() is None:
        try:
          os.kill(p.pid, signal.SIGCONT)
        except OSError:
          pass
    processes.stop(procs)
