"""jax.experimental.colocated_python through the embedded cluster: each
island runs the function in the client's colocated process beside it, as
one host of a multi-process job sees it; results match plain JAX (which
runs the function in this process); a raising or crashing function is the
caller's error and the islands serve on."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import cloudpickle
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import colocated_python as cp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import processes

pytestmark = pytest.mark.integration
# The colocated processes cannot import this test module: its functions
# travel by value (a user's own modules must be importable there, or be
# registered so too).
cloudpickle.register_pickle_by_value(sys.modules[__name__])
CLIENT = os.path.join(os.path.dirname(__file__), "client.py")


def _sharded(devices, values: np.ndarray, spec: P) -> jax.Array:
  mesh = Mesh(np.array(cp.colocated_cpu_devices(devices)).reshape(2, 4),
              ("a", "b"))
  return jax.device_put(values, NamedSharding(mesh, spec))


def _scaled(x: jax.Array) -> jax.Array:
  """x * 3 + 1, computed shard by shard with numpy where x's shards are."""
  return jax.make_array_from_single_device_arrays(
      x.shape, x.sharding,
      [jax.device_put(np.asarray(s.data) * 3 + 1, s.device)
       for s in x.addressable_shards])


def test_a_function_with_output_specs_matches_plain_jax(run_both):
  values = np.arange(8 * 12, dtype=np.float32).reshape(8, 12)

  def run(devices):
    x = _sharded(devices, values, P("a", "b"))
    f = cp.colocated_python(_scaled).specialize(out_specs_fn=lambda s: s)
    return f(x), f(f(x))

  once, twice = run_both(run)
  np.testing.assert_array_equal(once, values * 3 + 1)
  np.testing.assert_array_equal(twice, (values * 3 + 1) * 3 + 1)


def test_each_island_is_a_process_of_a_multi_process_job(proxy_devices):
  """process_index tells islands apart (orbax names its files by it); each
  holds its island's shards only, and sees every device of the client."""
  x = _sharded(proxy_devices, np.zeros((8, 8), np.int32), P("a", "b"))

  @cp.colocated_python
  def where(a: jax.Array) -> jax.Array:
    facts = np.array([[jax.process_index(), jax.process_count()],
                      [len(jax.devices()), len(a.addressable_shards)]] * 2,
                     np.int32)
    return jax.make_array_from_single_device_arrays(
        a.shape, a.sharding,
        [jax.device_put(facts, s.device) for s in a.addressable_shards])

  got = np.asarray(where.specialize(out_specs_fn=lambda s: s)(x))
  # Each device holds a 4x2 block: rows 0-3 are island 0's, 4-7 island 1's.
  for island, rows in ((0, got[:4]), (1, got[4:])):
    np.testing.assert_array_equal(rows[0::2, 0::2], np.full((2, 4), island))
    np.testing.assert_array_equal(rows[0::2, 1::2], np.full((2, 4), 2))
    np.testing.assert_array_equal(rows[1::2, 0::2], np.full((2, 4), 8))
    np.testing.assert_array_equal(rows[1::2, 1::2], np.full((2, 4), 4))


def _pid_of(devices):
  """A function returning, per island, its colocated process's pid."""
  x = _sharded(devices, np.zeros((8,), np.int32), P(("a", "b")))

  @cp.colocated_python
  def pid(a: jax.Array) -> jax.Array:
    return jax.make_array_from_single_device_arrays(
        a.shape, a.sharding,
        [jax.device_put(np.full(s.data.shape, os.getpid(), np.int32),
                        s.device) for s in a.addressable_shards])

  return pid.specialize(out_specs_fn=lambda s: s), x


def test_a_raising_function_fails_its_call_with_the_users_error(
    proxy_devices):
  x = _sharded(proxy_devices, np.ones((8, 4), np.float32), P("a", None))

  @cp.colocated_python
  def broken(a: jax.Array) -> jax.Array:
    raise ValueError("the user's own error, from the colocated process")

  with pytest.raises(Exception, match="the user's own error, from the "
                     "colocated process"):
    np.asarray(broken.specialize(out_specs_fn=lambda s: s)(x))
  # A function whose first call raised is called again (its pickle is sent
  # again, and the process, which kept it, knows it): its state is kept.
  calls: list[int] = []

  @cp.colocated_python
  def flaky(a: jax.Array) -> jax.Array:
    calls.append(1)
    if len(calls) == 1:
      raise ValueError("only the first call fails")
    return a

  flaky = flaky.specialize(out_specs_fn=lambda s: s)
  with pytest.raises(Exception, match="only the first call fails"):
    np.asarray(flaky(x))
  np.testing.assert_array_equal(np.asarray(flaky(x)), np.ones((8, 4)))
  # The same process serves the next call.
  pid, arg = _pid_of(proxy_devices)
  before = set(np.asarray(pid(arg)).tolist())
  assert len(before) == 2 and all(processes.alive(p) for p in before)


def test_a_crashed_process_fails_its_call_and_the_next_starts_anew(
    pathways, proxy_devices):
  pid, arg = _pid_of(proxy_devices)
  before = set(np.asarray(pid(arg)).tolist())
  workers = pathways.pids

  @cp.colocated_python
  def crash(a: jax.Array) -> jax.Array:
    os.kill(os.getpid(), signal.SIGKILL)
    return a

  with pytest.raises(Exception, match="was killed by signal 9"):
    np.asarray(crash.specialize(out_specs_fn=lambda s: s)(arg))
  after = set(np.asarray(pid(arg)).tolist())
  assert len(after) == 2 and not after & before
  assert not any(processes.alive(p) for p in before)
  # The workers never noticed: same processes, still computing.
  assert pathways.pids == workers
  assert float(jax.jit(jnp.sum)(jnp.arange(5.0))) == 10.0


def test_output_that_breaks_its_spec_is_refused_by_name(proxy_devices):
  x = _sharded(proxy_devices, np.ones((8, 4), np.float32), P("a", None))

  @cp.colocated_python
  def wrong(a: jax.Array) -> jax.Array:
    return jax.make_array_from_single_device_arrays(
        a.shape, a.sharding,
        [jax.device_put(np.asarray(s.data, np.int32), s.device)
         for s in a.addressable_shards])

  with pytest.raises(Exception, match=r"output 0 is int32\[8, 4\]; its spec "
                     r"is float32\[8, 4\]"):
    np.asarray(wrong.specialize(out_specs_fn=lambda s: s)(x))


def _client(cluster, mode: str) -> dict:
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)
  env.update(JAX_PATHWAYS_ADDRESS=cluster.address,
             JAX_PATHWAYS_TOKEN=cluster.token)
  out = subprocess.run([sys.executable, CLIENT, mode], env=env, cwd="/",
                       capture_output=True, text=True, timeout=180,
                       check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.splitlines()[-1])


def test_a_clients_processes_end_with_its_session(pathways, proxy_devices):
  pids = _client(pathways, "pids")["pids"]
  assert len(pids) == 2
  # Another client's processes are its own, on the same islands.
  pid, arg = _pid_of(proxy_devices)
  assert not set(pids) & set(np.asarray(pid(arg)).tolist())
  deadline = time.monotonic() + 60
  while any(processes.alive(p) for p in pids):
    assert time.monotonic() < deadline, f"{pids} outlived their client"
    time.sleep(0.1)


def test_a_client_running_other_packages_is_refused_naming_both(pathways):
  error = _client(pathways, "mismatch")["error"]
  assert "FAILED_PRECONDITION" in error, error
  assert "the colocated process's packages are not the client's" in error
  assert f"jax 0.0.1+other-{jax.__version__} (client) vs {jax.__version__}" \
      f" (colocated process)" in error, error


@pytest.fixture(scope="module")
def closed_cluster():
  """A cluster whose owner did not allow colocated Python."""
  from jax_pathways.cluster.local_cluster import LocalCluster  # pylint: disable=import-outside-toplevel
  with processes.running(LocalCluster(2, 2, 16)) as cluster:
    yield cluster


def test_a_cluster_that_does_not_allow_it_refuses_by_name(closed_cluster):
  error = _client(closed_cluster, "call")["error"]
  assert "FAILED_PRECONDITION: colocated Python is off on this cluster" in (
      error), error
  assert "--colocated-python" in error


def test_a_pickle_that_is_no_function_fails_its_call_by_name(proxy_devices):
  """What JAX's client would send, with a hostile pickle: the colocated
  process refuses it (the controller and worker never unpickle), the call
  fails with why, and the island serves on."""
  from jax._src.interpreters import pxla  # pylint: disable=import-outside-toplevel
  from jax.extend.ifrt_programs import ifrt_programs  # pylint: disable=import-outside-toplevel
  x = _sharded(proxy_devices, np.ones((8, 4), np.float32), P("a", None))
  spec = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
  devices = x.sharding._internal_device_list  # pylint: disable=protected-access
  results = []
  for pickled in (b"\x80\x04cos\ngetpid\n)R.", b"not a pickle"):
    program = ifrt_programs.make_colocated_python_program(
        "hostile", pickled, devices, [spec], [spec])
    executable = devices[0].client.compile_ifrt_program(
        program, ifrt_programs.make_colocated_python_compile_options())
    out = executable.execute_sharded([x], with_tokens=False)
    [y] = out.consume_with_handlers(pxla.global_avals_to_results_handler(
        (jax.core.ShapedArray(x.shape, x.dtype),), (x.sharding,),
        committed=True).handlers)
    with pytest.raises(Exception) as e:
      np.asarray(y)
    results.append(str(e.value))
  # A pickle that calls a function (os.getpid) unpickles to what it
  # returns, not a function with its specs: refused, nothing else.
  assert "colocated Python function raised on island" in results[0]
  assert "cannot unpack" in results[0], results[0]
  assert "colocated Python function raised on island" in results[1]
  assert "UnpicklingError" in results[1], results[1]
  assert float(jax.jit(jnp.sum)(jnp.arange(5.0))) == 10.0


def test_a_function_that_waits_holds_only_its_own_lane(proxy_devices,
                                                      tmp_path):
  """While a colocated function blocks, programs on its islands go on."""
  release = str(tmp_path / "release")
  x = _sharded(proxy_devices, np.ones((8, 4), np.float32), P("a", None))

  @cp.colocated_python
  def wait(a: jax.Array) -> jax.Array:
    deadline = time.monotonic() + 120
    while not os.path.exists(release) and time.monotonic() < deadline:
      time.sleep(0.05)
    return a

  waiting = wait.specialize(out_specs_fn=lambda s: s)(x)
  step = jax.jit(lambda v: (v * 2).sum())
  assert [float(step(jnp.arange(8.0) + i)) for i in range(3)] == [
      56.0, 72.0, 88.0]
  assert not waiting.is_ready()
  with open(release, "w", encoding="ascii"):
    pass
  np.testing.assert_array_equal(np.asarray(waiting), np.ones((8, 4)))
