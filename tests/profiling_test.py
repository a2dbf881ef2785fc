"""jax_pathways.profile(): JAX's own trace of this process and each island's
launches, written by this process into the run directory JAX makes."""
import os
import socket

import jax
import jax.numpy as jnp
import pytest

import jax_pathways
from jax_pathways import profiling

pytestmark = pytest.mark.integration


def _window(data) -> tuple[int, int]:
  """(start, stop) wall-clock ns of a profile, from its Task Environment."""
  env = dict(data.find_plane_with_name("Task Environment").stats)
  return env["profile_start_time"], env["profile_stop_time"]


def test_profile_holds_each_islands_launches_beside_jaxs_trace(proxy_devices,
                                                               tmp_path):
  def scaled_square(x):
    return x * x * 0.5

  f = jax.jit(scaled_square)
  xs = [jax.device_put(jnp.ones((32, 32)), d)
        for d in (proxy_devices[0], proxy_devices[-1])]  # one per island
  xs = [f(x) for x in xs]  # compiled before the profile
  jax.block_until_ready(xs)

  with jax_pathways.profile(tmp_path) as recorded:
    for _ in range(3):
      xs = [f(x) for x in xs]
    jax.block_until_ready(xs)

  runs = os.listdir(tmp_path / "plugins" / "profile")
  assert len(runs) == 1, runs
  run = tmp_path / "plugins" / "profile" / runs[0]
  files = sorted(os.listdir(run))
  hosts = [f for f in files
           if f.endswith(".xplane.pb") and not f.startswith("island_")]
  assert len(hosts) == 1, files  # JAX's own trace of this process
  jax_start, jax_stop = _window(
      jax.profiler.ProfileData.from_file(str(run / hosts[0])))
  for island in (0, 1):
    data = jax.profiler.ProfileData.from_file(
        str(run / f"island_{island}.xplane.pb"))
    start, stop = _window(data)
    assert jax_start <= start < stop <= jax_stop
    assert [p.name for p in data.planes if p.name.startswith("/device")] == [
        f"/device:CUSTOM:{island}"]
    launches = [(e.name, e.start_ns, e.duration_ns)
                for p in data.planes for line in p.lines
                if line.name == "launch" for e in line.events]
    assert [name for name, *_ in launches] == ["jit_scaled_square"] * 3
    for _, offset, duration in launches:  # from the profile's start
      assert 0 <= offset <= offset + duration <= stop - start
    assert [offset for _, offset, _ in launches] == sorted(
        offset for _, offset, _ in launches)
    assert ([op.name for op in recorded.launches(island)] ==
            ["jit_scaled_square"] * 3)


def test_a_loop_of_two_programs_shows_as_the_workers_ran_it(proxy_devices,
                                                           tmp_path):
  """A step spanning both islands and a step on island 0 alone, in a loop:
  each step reads its own previous results, so each program's launches
  follow one another, while the two programs run side by side on island 0
  (XLA:CPU runs independent programs at once). At 52b5207 the local step
  showed 0 us starting where the next spanning step started, spanning
  steps overlapped each other, and island 0's utilization read 1.9."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=import-outside-toplevel
  mesh = Mesh(np.array(proxy_devices), ("d",))

  @jax.jit
  def train_step(w, x):
    for _ in range(3):
      x = jnp.tanh(x @ w)
    return w - 0.01 * jnp.mean(x), x

  @jax.jit
  def local_step(a):
    return jnp.sin(a) @ a

  w = jax.device_put(np.eye(256, dtype=np.float32), NamedSharding(mesh, P()))
  x = jax.device_put(np.ones((512, 256), np.float32),
                     NamedSharding(mesh, P("d")))
  a = jax.device_put(np.ones((128, 128), np.float32), proxy_devices[0])
  w, x = train_step(w, x)
  a = local_step(a)
  jax.block_until_ready((w, x, a))  # compiled before the profile
  steps = 4
  with jax_pathways.profile(tmp_path) as recorded:
    for _ in range(steps):
      w, x = train_step(w, x)
      a = local_step(a)
    jax.block_until_ready((w, x, a))

  assert all(0 < u <= 1 for u in recorded.utilization().values()), (
      recorded.utilization())
  [run] = os.listdir(tmp_path / "plugins" / "profile")
  for island in (0, 1):
    data = jax.profiler.ProfileData.from_file(str(
        tmp_path / "plugins" / "profile" / run / f"island_{island}.xplane.pb"))
    [plane] = [p for p in data.planes if p.name.startswith("/device")]
    events = []
    for line in plane.lines:
      if not line.name.startswith("launch"):
        continue
      spans = sorted((e.start_ns, e.start_ns + e.duration_ns)
                     for e in line.events)
      for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start, f"{line.name} of island {island} overlaps"
      events += [(e.name, e.start_ns, e.duration_ns) for e in line.events]
    events.sort(key=lambda e: e[1])
    # The files say what the worker's records say, launch by launch.
    mine = recorded.launches(island)
    assert sorted((op.name, op.ready_ns - op.start_ns) for op in mine) == (
        sorted((name, duration) for name, _, duration in events))
    by_name: dict[str, list] = {}
    for op in sorted(mine, key=lambda op: op.seq):
      by_name.setdefault(op.name, []).append(op)
    assert len(by_name["jit_train_step"]) == steps
    assert len(by_name.get("jit_local_step", [])) == (
        steps if island == 0 else 0)
    for ops in by_name.values():  # each reads the one before: in turn
      for before, after in zip(ops, ops[1:]):
        assert before.ready_ns <= after.start_ns, (before, after)
    for op in by_name.get("jit_local_step", []):
      assert op.ready_ns > op.start_ns, op  # not 0 us


def test_profile_names_the_run_after_the_session_id(proxy_devices, tmp_path):
  options = jax.profiler.ProfileOptions()
  options.session_id = "step_7"
  with jax_pathways.profile(str(tmp_path), profiler_options=options):
    jax.block_until_ready(jnp.ones(4, device=proxy_devices[0]) + 1)
  run = tmp_path / "plugins" / "profile" / "step_7"
  assert os.listdir(tmp_path / "plugins" / "profile") == ["step_7"]
  files = os.listdir(run)
  assert {"island_0.xplane.pb", "island_1.xplane.pb"} <= set(files), files
  assert len(files) > 2, files  # and JAX's own


def test_profile_refuses_a_url(tmp_path):
  with pytest.raises(ValueError, match="local directory, not 'gs://b/run'"):
    with jax_pathways.profile("gs://b/run"):
      pass


@pytest.mark.parametrize("address, host", [
    ("grpc://controller-0.example:8471", "controller-0.example"),
    ("grpc://10.0.0.2:8471", "10.0.0.2"),
    ("grpc://unix:/tmp/jp/clients.sock", socket.gethostname()),
    ("grpc://localhost:8471", socket.gethostname()),
])
def test_the_islands_are_named_after_the_controllers_host(address, host):
  assert profiling._host(address) == host  # pylint: disable=protected-access
