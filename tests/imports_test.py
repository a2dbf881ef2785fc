"""Every module of the package imports on its own, first: no module works
only because another happened to be imported before it (an import-time
circle held apart by import order)."""
import os
import subprocess
import sys

import jax_pathways

# In a child of its own (this process has imported much of the package): for
# each module, every jax_pathways module is forgotten and that one imported
# first. Third-party modules stay loaded (JAX is imported once, not per
# module); the compiled extensions are re-made from their cached
# definitions. Prints the modules that failed, with why.
_CHILD = r"""
import importlib, pkgutil, sys, traceback
import jax_pathways
names = sorted(m.name for m in pkgutil.walk_packages(
    jax_pathways.__path__, "jax_pathways."))
failed = []
for name in names:
  for loaded in [m for m in sys.modules if m.split(".")[0] == "jax_pathways"]:
    del sys.modules[loaded]
  try:
    importlib.import_module(name)
  except BaseException:
    failed.append(name + ":\n" + traceback.format_exc(limit=-3))
print(len(names))
print("\n".join(failed))
"""


def test_each_module_imports_first():
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)
  root = os.path.dirname(os.path.dirname(jax_pathways.__file__))
  out = subprocess.run([sys.executable, "-c", _CHILD], env=env, cwd=root,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  count, _, failed = out.stdout.partition("\n")
  assert int(count) > 80, out.stdout  # the walk found the package
  assert not failed.strip(), failed
