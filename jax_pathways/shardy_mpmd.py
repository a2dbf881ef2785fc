"""jaxlib's private Shardy MPMD extension, when it has the shape we rely on.

jaxlib 0.10.2 ships Shardy's MPMD partitioner as `jaxlib._sdy_mpmd`
(partitioning, lowering to IFRT IR, compiling IFRT IR on a backend). It is
private: its module init imports `jax.jaxlib._jax` and `mlir.ir` (Google's
internal module paths), so those names are aliased first, and every function
we call is checked for the keywords we pass, so a jaxlib that changed them
is reported as missing instead of failing halfway through.
"""
from __future__ import annotations

import functools
import sys
from types import ModuleType

from absl import logging

# Function -> keywords we pass (checked against its pybind signature).
_REQUIRED = {
    "apply_mpmd_partitioning": ("func_name", "named_meshes", "assignment",
                                "input_meshes", "output_meshes",
                                "donate_argnums", "partitioning_options"),
    "lower_to_ifrt": (),
    "clone_mlir_module": (),
    "compile_mpmd": ("devices", "out_avals", "out_shardings",
                     "xla_compile_options"),
    "get_compile_options": (),
}


@functools.cache
def _load() -> tuple[ModuleType | None, str]:
  try:
    import jaxlib  # pylint: disable=import-outside-toplevel
    import jaxlib._jax  # pylint: disable=import-outside-toplevel
    import jaxlib.mlir.ir  # pylint: disable=import-outside-toplevel
    sys.modules.setdefault("jax.jaxlib", jaxlib)
    sys.modules.setdefault("jax.jaxlib._jax", jaxlib._jax)  # pylint: disable=protected-access
    sys.modules.setdefault("mlir", jaxlib.mlir)
    sys.modules.setdefault("mlir.ir", jaxlib.mlir.ir)
    from jaxlib import _sdy_mpmd  # pylint: disable=import-outside-toplevel
  except Exception as e:  # pylint: disable=broad-except
    return None, f"jaxlib._sdy_mpmd cannot be imported ({e})"
  for name, keywords in _REQUIRED.items():
    fn = getattr(_sdy_mpmd, name, None)
    if fn is None:
      return None, f"jaxlib._sdy_mpmd has no {name}()"
    doc = (fn.__doc__ or "").split("\n", 1)[0]
    missing = [k for k in keywords if f"{k}:" not in doc]
    if missing:
      return None, (f"jaxlib._sdy_mpmd.{name}() no longer takes "
                    f"{', '.join(missing)}")
  logging.vlog(1, "using jaxlib._sdy_mpmd")
  return _sdy_mpmd, ""


def load() -> ModuleType | None:
  """The extension, or None (see unavailable_reason())."""
  return _load()[0]


def unavailable_reason() -> str:
  """Why load() returned None ("" if it did not)."""
  return _load()[1]
