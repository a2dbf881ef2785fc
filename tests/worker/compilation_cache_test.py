"""Compiled programs kept on disk: an entry is loaded only whole and from a
directory that is this user's alone; the embedded cluster keeps them under
JAX's `jax_compilation_cache_dir`, and a later run's workers load them
(bit-identical results, no compile)."""
import glob
import os
import subprocess
import sys
import textwrap
import time

import pytest

from jax_pathways.worker.compilation_cache import CompilationCache


def test_entries_come_back_whole_or_not_at_all(tmp_path):
  cache = CompilationCache(str(tmp_path / "cache"))
  assert os.stat(cache.directory).st_mode & 0o777 == 0o700
  key = cache.key(b"program", b"options")
  assert cache.key(b"program", b"options") == key
  assert cache.key(b"programo", b"ptions") != key  # parts are delimited
  assert cache.get(key) is None
  cache.put(key, [b"executable", b"", b"runner" * 1000])
  assert cache.get(key) == [b"executable", b"", b"runner" * 1000]
  path = os.path.join(cache.directory, key)
  data = open(path, "rb").read()
  for damaged in (data[:-1], data[:10], data[:20] + b"x" + data[21:], b""):
    with open(path, "wb") as f:
      f.write(damaged)
    assert cache.get(key) is None
    assert not os.path.exists(path)  # dropped
  assert glob.glob(os.path.join(cache.directory, ".tmp-*")) == []


def test_an_entry_loads_only_under_its_own_key_and_versions(tmp_path):
  cache = CompilationCache(str(tmp_path / "cache"))
  double, add = cache.key(b"a*2"), cache.key(b"a+100")
  cache.put(double, [b"code of a*2"])
  cache.put(add, [b"code of a+100"])
  assert cache.get(double) == [b"code of a*2"]
  # Swapped on disk: neither runs for the other's program.
  a, b = (os.path.join(cache.directory, k) for k in (double, add))
  os.rename(a, a + ".x")
  os.rename(b, a)
  os.rename(a + ".x", b)
  for key in (double, add):
    assert cache.get(key) is None
    assert not os.path.exists(os.path.join(cache.directory, key))
  # Another version's writer: its entries are not this one's keys, and one
  # copied under this one's key is refused as well.
  other = CompilationCache(cache.directory, stamp=b"jax_pathways 0.0.1")
  assert other.key(b"a*2") != double
  other.put(other.key(b"a*2"), [b"old code of a*2"])
  os.rename(os.path.join(cache.directory, other.key(b"a*2")),
            os.path.join(cache.directory, double))
  assert cache.get(double) is None
  cache.put(double, [b"code of a*2"])  # compiled again, kept again
  assert cache.get(double) == [b"code of a*2"]


def test_writes_abandoned_by_killed_writers_are_removed(tmp_path):
  directory = tmp_path / "cache"
  CompilationCache(str(directory))
  old, live = directory / ".tmp-old", directory / ".tmp-live"
  old.write_bytes(b"half an entry")
  live.write_bytes(b"being written")
  two_hours_ago = time.time() - 7200
  os.utime(old, (two_hours_ago, two_hours_ago))
  CompilationCache(str(directory))  # the next worker
  assert not old.exists() and live.exists()


def test_a_directory_others_may_write_to_is_refused(tmp_path):
  shared = tmp_path / "shared"
  shared.mkdir()
  os.chmod(shared, 0o777)
  with pytest.raises(PermissionError, match="writable by no one else"):
    CompilationCache(str(shared))


CLIENT = """
import os
os.environ["JAX_PLATFORMS"] = "proxy,cpu"
import jax_pathways
jax_pathways.initialize(islands=2, devices_per_island=2)
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
jax.config.update("jax_num_cpu_devices", 4)


def run(devices):
  # One program across both islands (the global client, its float sums
  # rank ordered: two compiles each) and one on island 0 alone.
  mesh = Mesh(np.array(devices), ("i",))
  x = jax.device_put(np.arange(64, dtype=np.float32).reshape(8, 8) / 7,
                     NamedSharding(mesh, P("i")))
  span = jax.jit(jax.shard_map(
      lambda a: jax.numpy.tanh(a) + jax.lax.psum(a, "i") / 3, mesh=mesh,
      in_specs=P("i"), out_specs=P("i")))
  y = jax.device_put(np.ones((4, 4), np.float32) / 3, devices[0])
  local = jax.jit(lambda a: jax.numpy.sin(a) @ a.T)
  # A token passed between programs over two devices: never kept (jaxlib
  # 0.10.2 crashes serializing it; it took the worker down until 2026-11).
  pair = Mesh(np.array(devices[:2]), ("d",))
  z = jax.device_put(np.arange(4, dtype=np.float32) / 3,
                     NamedSharding(pair, P("d")))
  _, token = jax.jit(lambda a: (a, jax.lax.create_token()))(z)
  total, _ = jax.jit(lambda t, a: (a.sum(), jax.lax.after_all(t)))(token, z)
  return (np.asarray(span(x)).tobytes() + np.asarray(local(y)).tobytes() +
          np.asarray(total).tobytes())


print("SAME", run(jax.devices("proxy")) == run(jax.devices("cpu")))
"""


@pytest.mark.integration
def test_a_later_run_loads_what_the_first_compiled(tmp_path):
  def run(logs):
    # Relative, as users write it: the workers run elsewhere.
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR="jax",
               JAX_PATHWAYS_LOG_DIR=str(tmp_path / logs))
    env.pop("JAX_PLATFORMS", None)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(CLIENT)],
                         env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=180, check=False)
    assert out.returncode == 0 and "SAME True" in out.stdout, \
        out.stderr[-3000:]
    assert "compilation cache" not in out.stderr  # no warning: it is used
    text = ""
    for path in glob.glob(str(tmp_path / logs / "worker*.log")):
      with open(path, encoding="utf-8") as f:
        text += f.read()
    return text

  loaded = "loaded from the compilation cache"
  assert run("logs1").count(loaded) == 0
  # The spanning program on each island's worker, the other on island 0's;
  # not the two passing tokens.
  entries = sorted(glob.glob(str(tmp_path / "jax" / "jax_pathways" / "*")))
  assert len(entries) == 3
  # Two entries swapped on disk: each is ignored (and compiled again), the
  # third loads, and every result is still plain JAX's.
  first, second = entries[0], entries[1]
  os.rename(first, first + ".x")
  os.rename(second, first)
  os.rename(first + ".x", second)
  logs = run("logs2")
  assert logs.count(loaded) == 1
  assert logs.count("holds the entry of another program") == 2
