"""Runs each of PROGRAMS through an embedded cluster of one CUDA island and
on this process's own GPU with plain JAX, and prints one JSON line per
program: whether the results have the same bits, and how they differ if not
(tests/platforms/cuda_test.py reads them). Needs a GPU and JAX's CUDA
plugin."""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable

import jax

jax.config.update("jax_platforms", "proxy,cuda,cpu")

import jax_pathways  # noqa: E402  pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # noqa: E402  pylint: disable=g-import-not-at-top
import numpy as np  # noqa: E402  pylint: disable=g-import-not-at-top

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))  # tests/
import bits  # noqa: E402  pylint: disable=g-import-not-at-top


def mlp_training() -> Any:
  rng = np.random.default_rng(0)
  x = rng.normal(size=(256, 64)).astype(np.float32)
  y = rng.normal(size=(256, 8)).astype(np.float32)
  params = [rng.normal(size=s).astype(np.float32) * 0.1
            for s in ((64, 128), (128,), (128, 8), (8,))]

  def loss(p, x, y):
    h = jnp.tanh(x @ p[0] + p[1])
    return jnp.mean((h @ p[2] + p[3] - y) ** 2)

  @jax.jit
  def step(p, x, y):
    value, grads = jax.value_and_grad(loss)(p, x, y)
    return [w - 0.05 * g for w, g in zip(p, grads)], value

  p, x, y = jax.device_put((params, x, y))
  losses = []
  for _ in range(5):
    p, value = step(p, x, y)
    losses.append(value)
  return losses, p


def random_and_reductions() -> Any:
  key = jax.random.key(0)
  x = jax.random.normal(key, (1024, 1024))
  return (x.sum(), x.mean(axis=0), jnp.max(x), jax.random.bits(key, (16,)),
          jnp.cumsum(x[0]))


def matmuls() -> Any:
  rng = np.random.default_rng(1)
  a = jnp.asarray(rng.normal(size=(512, 512)), jnp.bfloat16)
  b = jnp.asarray(rng.normal(size=(512, 512)), jnp.bfloat16)
  f = jnp.asarray(rng.normal(size=(512, 512)), jnp.float32)
  return jax.jit(lambda a, b, f: (a @ b, f @ f.T))(a, b, f)


def convolution() -> Any:
  rng = np.random.default_rng(2)
  x = jnp.asarray(rng.normal(size=(8, 16, 32, 32)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(32, 16, 3, 3)), jnp.float32)
  return jax.jit(lambda x, w: jax.lax.conv_general_dilated(
      x, w, (1, 1), "SAME"))(x, w)


def control_flow() -> Any:
  def body(c, x):
    c = jnp.sin(c) + x
    return c, c * 2

  xs = jnp.arange(100, dtype=jnp.float32)
  return (jax.jit(lambda xs: jax.lax.scan(body, 0.0, xs))(xs),
          jax.jit(lambda n: jax.lax.fori_loop(0, n, lambda i, c: c * 1.5 + i,
                                              1.0))(20))


def cholesky() -> Any:
  rng = np.random.default_rng(3)
  a = rng.normal(size=(64, 64)).astype(np.float32)
  return jax.jit(jnp.linalg.cholesky)(jnp.asarray(a @ a.T + 64 * np.eye(64,
                                                  dtype=np.float32)))


def donation() -> Any:
  x = jnp.arange(1 << 20, dtype=jnp.float32)
  return jax.jit(lambda x: x * 2 + 1, donate_argnums=0)(x)


def host_round_trip() -> Any:
  """64 MB up and back: compared with plain JAX's, so with the input."""
  data = np.random.default_rng(4).normal(size=(16 << 20,)).astype(np.float32)
  return jax.device_put(data)


PROGRAMS: dict[str, Callable[[], Any]] = {
    f.__name__: f for f in (mlp_training, random_and_reductions, matmuls,
                            convolution, control_flow, cholesky, donation,
                            host_round_trip)}


def main() -> None:
  jax_pathways.initialize(islands=1, devices_per_island=1, platform="cuda")
  proxy, gpu = jax.devices("proxy")[0], jax.devices("cuda")[0]
  print(json.dumps({"proxy": [proxy.platform, proxy.device_kind],
                    "gpu": [gpu.platform, gpu.device_kind]}), flush=True)
  for name, program in PROGRAMS.items():
    try:
      with jax.default_device(gpu):
        expected = jax.tree.map(np.asarray, program())
      with jax.default_device(proxy):
        actual = jax.tree.map(np.asarray, program())
      differs = bits.difference(expected, actual)
      out = {"program": name, "same_bits": differs is None,
             "difference": (differs or "")[:2000]}
    except Exception as e:  # pylint: disable=broad-except
      out = {"program": name, "error": f"{type(e).__name__}: {e}"[:2000]}
    print(json.dumps(out), flush=True)
  jax_pathways.shutdown()


if __name__ == "__main__":
  sys.exit(main())
