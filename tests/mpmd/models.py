"""A small MLP, pipelined and plain, for the mpmd tests and scripts."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jax_pathways import mpmd

DIMS = (16, 32, 32, 32, 8)   # 4 layers
LEARNING_RATE = 0.1


def _layer(w: Any, b: Any, h: Any, last: bool) -> Any:
  h = h @ w + b
  return h if last else jnp.tanh(h)


@dataclasses.dataclass
class Mlp:
  stages: int
  microbatches: int
  params: Any
  x: np.ndarray
  y: np.ndarray
  train_step: Callable[..., Any]     # marked: (params, (x, y) lists)
  reference_step: Callable[..., Any]  # plain JAX: (params, x, y)

  def stage_names(self) -> list[str]:
    return [f"s{s}" for s in range(self.stages)]


def make_mlp(stages: int, microbatches: int, batch: int = 8,
             seed: int = 0) -> Mlp:
  layers = len(DIMS) - 1
  per = layers // stages

  def make_stage(s: int) -> Callable[..., Any]:
    @mpmd.stage(f"s{s}")
    def run(ps: Any, h: Any) -> Any:
      for k, (w, b) in enumerate(ps):
        h = _layer(w, b, h, s * per + k == layers - 1)
      return h
    return run

  stage_fns = [make_stage(s) for s in range(stages)]

  def microbatch_loss(params: Any, batch_: Any) -> Any:
    x, y = batch_
    h = x
    for s, fn in enumerate(stage_fns):
      h = fn(params[s * per:(s + 1) * per], h)
    return jnp.mean((h - y) ** 2)

  def sgd(params: Any, grads: Any) -> Any:
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)

  def train_step(params: Any, batch_: Any) -> Any:
    loss, grads = mpmd.value_and_grad(microbatch_loss)(params, batch_)
    return sgd(params, grads), loss

  def reference_loss(params: Any, x: Any, y: Any) -> Any:
    total = 0.0
    for xs, ys in zip(jnp.split(x, microbatches), jnp.split(y, microbatches)):
      h = xs
      for k, (w, b) in enumerate(params):
        h = _layer(w, b, h, k == layers - 1)
      total = total + jnp.mean((h - ys) ** 2)
    return total / microbatches

  @jax.jit
  def reference_step(params: Any, x: Any, y: Any) -> Any:
    loss, grads = jax.value_and_grad(reference_loss)(params, x, y)
    return sgd(params, grads), loss

  rng = np.random.default_rng(seed)
  params = [(rng.normal(size=(DIMS[k], DIMS[k + 1])).astype(np.float32)
             / np.sqrt(DIMS[k]),
             (rng.normal(size=(DIMS[k + 1],)) * 0.1).astype(np.float32))
            for k in range(layers)]
  n = microbatches * batch
  x = rng.normal(size=(n, DIMS[0])).astype(np.float32)
  y = rng.normal(size=(n, DIMS[-1])).astype(np.float32)
  return Mlp(stages, microbatches, params, x, y, train_step, reference_step)


def relative_error(actual: Any, expected: Any) -> float:
  a = np.asarray(actual, np.float64)
  e = np.asarray(expected, np.float64)
  return float(np.max(np.abs(a - e)) / max(np.max(np.abs(e)), 1e-30))
