"""The README's snippets, in a fresh process, in the order a user writes
them: the two lines of its top, JAX's compilation cache set after
initialize() (the embedded cluster cannot follow: said), then "Using it"
(whose initialize() is then a no-op) with `jax.make_mesh` as the first
thing JAX does (JAX's own make_mesh refused the islands at 52b5207: JAX
starts its backend inside that call)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

pytestmark = pytest.mark.integration

README = os.path.join(os.path.dirname(__file__), "..", "README.md")


def _snippets() -> str:
  with open(README) as f:
    blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
  top, using = blocks[0], blocks[1]
  assert "jax_pathways.initialize()" in top, top
  # Its first JAX call: the mesh (as the script), the rest after.
  mesh_line = next(l for l in using.splitlines() if "jax.make_mesh" in l)
  rest = [l for l in using.splitlines() if l != mesh_line]
  # Between them, the README's compilation cache setting, where users put
  # it: after initialize().
  late = 'jax.config.update("jax_compilation_cache_dir", sys.argv[1])'
  return "\n".join([top, late, mesh_line, *rest])


CHECKS = """
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
assert mesh.devices.shape == (2, 4), mesh
assert [d.slice_index for d in mesh.devices[:, 0]] == [0, 1]
x = np.arange(64, dtype=np.float32).reshape(8, 8)
y = jax.jit(lambda a: a * 2 + 1)(
    jax.device_put(x, NamedSharding(mesh, P("data", "model"))))
assert (np.asarray(y) == x * 2 + 1).all()
flat = jax.make_mesh((8,), ("data",))
assert flat.devices.shape == (8,)
print("ok", flush=True)
"""


def test_readme_snippets_run_in_a_fresh_process(tmp_path):
  # INFO shown, for the banner (absl logs through Python's logging).
  script = ("import logging, sys\nlogging.basicConfig(level=logging.INFO)\n"
            + _snippets() + CHECKS)
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  # A temp folder of its own (short: socket paths are bounded), to see
  # what the run leaves there.
  env["TMPDIR"] = temp = tempfile.mkdtemp(prefix="jp")
  try:
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)],
                         env=env, capture_output=True, text=True,
                         timeout=300, cwd=tempfile.gettempdir())
    left = os.listdir(temp)
  finally:
    shutil.rmtree(temp, ignore_errors=True)
  assert out.returncode == 0, out.stderr[-4000:]
  # One line saying where the cluster is, how big, and where its logs are.
  banner = re.search(r"jax_pathways: embedded cluster at grpc://unix:\S+: "
                     r"2 islands x 4 cpu devices; logs in (\S+)", out.stderr)
  assert banner, out.stderr[-4000:]
  # A healthy run removes its folder, logs and sockets, at exit.
  assert not [n for n in left if n.startswith("jax_pathways_")], left
  assert out.stdout.splitlines()[-1] == "ok", out.stdout
  # The late setting: said, with what to do.
  assert ("jax_compilation_cache_dir is " + str(tmp_path)) in out.stderr, (
      out.stderr[-4000:])
  assert "Set it before initialize()" in out.stderr
