"""Marking a pipeline in ordinary JAX code: stages and microbatches.

    @mpmd.stage("encoder")
    def encoder(params, x): ...

    loss, grads = mpmd.value_and_grad(microbatch_loss)(params, xs, ys)

A stage is a function that runs on one mesh. It becomes three nested jits
whose lowered names say what they are (`mpmdstage__<name>__f`: forward with
the residuals its backward needs, `__b`: backward, `__p`: plain call), tied
together by a custom_vjp, so forward and backward are told apart by name,
not by how JAX happens to print locations. `value_and_grad` runs the
microbatches as nested jits named `mpmdmb__<i>__`, which the lowering turns
into microbatch calls the partitioner schedules.
"""
from __future__ import annotations

import functools
import re
from typing import Any, Callable, Sequence

import jax

STAGE_PREFIX = "mpmdstage__"
MICROBATCH_PREFIX = "mpmdmb__"
FORWARD, BACKWARD, PLAIN = "f", "b", "p"
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def _named_jit(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
  def body(*args: Any) -> Any:
    return fn(*args)
  body.__name__ = body.__qualname__ = name
  return jax.jit(body)


def stage_symbol(name: str, kind: str) -> str:
  return f"{STAGE_PREFIX}{name}__{kind}"


def stage(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
  """Marks a function as the pipeline stage `name` (placed by the topology).

  The function takes and returns arrays (pytrees of them); its positional
  arguments are differentiated through.
  """
  if not isinstance(name, str) or not _NAME.match(name) or "__" in name:
    raise ValueError(f"stage name {name!r} must be an identifier without "
                     "'__'")

  def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
    plain = _named_jit(fn, stage_symbol(name, PLAIN))
    forward = _named_jit(lambda *a: jax.vjp(fn, *a),
                         stage_symbol(name, FORWARD))
    backward = _named_jit(lambda vjp, g: vjp(g), stage_symbol(name, BACKWARD))

    @jax.custom_vjp
    def staged(*args: Any) -> Any:
      return plain(*args)

    staged.defvjp(forward, backward)
    staged = functools.wraps(fn)(staged)
    staged.stage_name = name  # type: ignore[attr-defined]
    return staged

  return mark


@functools.cache
def _microbatch(fn: Callable[..., Any], i: int) -> Callable[..., Any]:
  return _named_jit(fn, f"{MICROBATCH_PREFIX}{i}__")


def value_and_grad(fn: Callable[..., Any]) -> Callable[..., Any]:
  """Mean loss and gradients over microbatches, pipelined.

  `fn(params, *batch)` is one microbatch's loss; the returned function takes
  `(params, *batches)`, each batch a list of M microbatches, and returns
  (mean loss, mean gradients w.r.t. params) like
  `jax.value_and_grad(lambda p: mean_i fn(p, *batch_i))`.
  """

  def run(params: Any, *batches: Sequence[Any]) -> tuple[Any, Any]:
    sizes = {len(b) for b in batches}
    if len(sizes) != 1 or not sizes.issubset(range(1, 1 << 20)):
      raise ValueError("value_and_grad takes lists of microbatches of one "
                       f"length after params; got lengths {sorted(sizes)}")
    m = sizes.pop()

    def mean_loss(p: Any) -> Any:
      # Issued last to first so JAX transposes them first to last: the
      # gradient sum then ends at the last microbatch's backward, which the
      # partitioner fuses it into, leaving every schedule its natural order.
      losses = {i: _microbatch(fn, i)(p, *[b[i] for b in batches])
                for i in reversed(range(m))}
      return sum((losses[i] for i in range(1, m)), losses[0]) / m

    return jax.value_and_grad(mean_loss)(params)

  return run
