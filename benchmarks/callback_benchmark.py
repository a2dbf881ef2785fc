"""Host callbacks: what a callback into the user's process costs.

    python benchmarks/callback_benchmark.py [--steps 200] [--calls 300]
        [--repeats 3] [--cases print_step io_callback no_callback]

Three cases, each through jax_pathways (one island of 4 CPU devices) and in
process (4 CPU devices), interleaved, medians:
  print_step   a data-parallel training step that jax.debug.prints its
               loss every step (stdout discarded); time per step
  io_callback  a jitted call on one device whose io_callback returns its
               16 floats doubled, read back; time per call (one round trip
               worker -> controller -> client and back)
  no_callback  the training step without the print, through jax_pathways
               with this process serving callbacks (as always) and with
               the callbacks stream stopped: what serving them costs a
               program that makes none
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
from typing import Any, Callable

# In-process JAX too needs a spare pool thread per device here: on a host
# with fewer cores than devices, its CPU client's pool (one thread per core,
# at least one per device) is taken whole by a program waiting on every
# device, and jax.debug.print's copy to the host then never runs (XLA
# aborts the process after 40 s). The workers do this themselves.
os.environ.setdefault("NPROC", str(max(os.cpu_count() or 1, 4) + 4))

from harness import emit, interleaved, log, setup, timed  # pylint: disable=g-bad-import-order

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import io_callback  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402
import numpy as np  # noqa: E402

from jax_pathways.client import host_callbacks  # noqa: E402


def _loss(w: jax.Array, x: jax.Array) -> jax.Array:
  return jnp.mean((x @ w) ** 2)


def _step(printing: bool) -> Callable[[jax.Array, jax.Array], Any]:
  @jax.jit
  def step(w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    loss, grad = jax.value_and_grad(_loss)(w, x)
    if printing:
      jax.debug.print("loss {loss}", loss=loss)
    return w - 0.01 * grad, loss
  return step


def _loop(devices: list[Any], printing: bool) -> Callable[[int], None]:
  """`steps(n)`: n training steps on `devices`, warmed up."""
  mesh = Mesh(np.array(devices), ("d",))
  batch = NamedSharding(mesh, PartitionSpec("d"))
  w = jax.device_put(np.ones((64, 8), np.float32),
                     NamedSharding(mesh, PartitionSpec()))
  x = jax.device_put(np.random.default_rng(0).random((32, 64), np.float32),
                     batch)
  step = _step(printing)
  state = {"w": w}

  def steps(n: int) -> None:
    w = state["w"]
    with contextlib.redirect_stdout(io.StringIO()):
      for _ in range(n):
        w, _ = step(w, x)
      np.asarray(w)
      jax.effects_barrier()
    state["w"] = w

  steps(2)
  return steps


def _round_trips(device: Any) -> Callable[[int], None]:
  """`calls(n)`: n calls of a program whose io_callback doubles 16 floats."""
  f = jax.jit(lambda x: io_callback(lambda v: v * 2,
                                    jax.ShapeDtypeStruct((16,), jnp.float32),
                                    x) + 1)
  x = jax.device_put(np.arange(16, dtype=np.float32), device)

  def calls(n: int) -> None:
    for _ in range(n):
      np.asarray(f(x))

  calls(2)
  return calls


def _per(run: Callable[[int], None], n: int) -> Callable[[], float]:
  return lambda: timed(lambda: run(n)) / n


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--calls", type=int, default=300)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--cases", nargs="*",
                      default=["print_step", "io_callback", "no_callback"])
  args = parser.parse_args()
  pathways, local = setup(islands=1)

  if "print_step" in args.cases:
    med = interleaved({"pathways": _per(_loop(pathways, True), args.steps),
                       "jax": _per(_loop(local, True), args.steps)},
                      args.repeats)
    _emit("print_step", med, steps=args.steps)

  if "io_callback" in args.cases:
    med = interleaved({
        "pathways": _per(_round_trips(pathways[0]), args.calls),
        "jax": _per(_round_trips(local[0]), args.calls)}, args.repeats)
    _emit("io_callback", med, calls=args.calls)

  if "no_callback" in args.cases:
    _no_callback(pathways, local, args.steps, args.repeats)


def _no_callback(pathways: list[Any], local: list[Any], n: int,
                 repeats: int) -> None:
  """The training step without callbacks, with this process serving
  callbacks and (stream stopped) not."""
  steps = _per(_loop(pathways, False), n)
  serving = host_callbacks.serving()

  def unserved() -> float:  # as a process that never served callbacks
    host_callbacks.stop()
    try:
      return steps()
    finally:
      host_callbacks.start(*serving)

  med = interleaved({"pathways": steps, "pathways_unserved": unserved,
                     "jax": _per(_loop(local, False), n)}, repeats)
  _emit("no_callback", med, steps=n, served_vs_unserved=round(
      med["pathways"] / med["pathways_unserved"], 3))


def _emit(case: str, med: dict[str, float], **values: Any) -> None:
  us = {f"{k}_us": round(v * 1e6, 1) for k, v in med.items()}
  ratio = round(med["pathways"] / med["jax"], 2)
  emit("callback", case, **us, baseline="jax", ratio=ratio, **values)
  log(f"{case:12s} " + "  ".join(f"{k} {v:.1f}" for k, v in us.items()) +
      f"  ({ratio}x jax)")


if __name__ == "__main__":
  main()
