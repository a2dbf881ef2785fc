"""MLIR contexts that read what JAX writes, from jaxlib alone.

The dialects of jax._src.interpreters.mlir.make_ir_context, without importing
jax: the processes that read programs (programs/reader.py) start with each
controller and need nothing else of JAX, whose import costs about a second
of CPU, three times all the rest of a reader. Imported where a program is
read (the controller itself never imports jaxlib)."""
from __future__ import annotations

from jaxlib.mlir import ir
from jaxlib.mlir._mlir_libs import _jax_mlir_ext
from jaxlib.mlir.dialects import chlo, mhlo, mpmd, sdy, stablehlo

_REGISTRY = ir.DialectRegistry()
_jax_mlir_ext.register_dialects(_REGISTRY)
_POOL = ir.ThreadPool()  # one for every context, as JAX shares one


class _Context(ir.Context):

  def __init__(self):  # pylint: disable=super-init-not-called
    # Not ir.Context.__init__, which loads every dialect linked into jaxlib:
    # only those registered by make() are (as JAX's contexts do).
    super(ir.Context, self).__init__()  # pylint: disable=bad-super-call


def make() -> ir.Context:
  """A new context with JAX's dialects loaded."""
  context = _Context()
  context.append_dialect_registry(_REGISTRY)
  context.load_all_available_dialects()
  context.set_thread_pool(_POOL)
  sdy.register_dialect(context)
  mpmd.register_dialect(context)
  mhlo.register_mhlo_dialect(context)
  chlo.register_dialect(context)
  stablehlo.register_dialect(context)
  return context
