"""A mixture of experts over two islands: 8 experts, one per device.

    pip install '.[examples]' && python examples/moe.py [--plain] [--steps N]

A small residual MLP model whose second block is an expert-parallel
mixture-of-experts layer (GShard style): a router picks the top 2 of 8
experts for every token, each expert takes at most `capacity` tokens from
each device (capacity factor 1.25; tokens past it are dropped and pass
through the residual), and `jax.lax.all_to_all` inside `shard_map` sends
the tokens to their experts' devices and the results back. The mesh's one
axis, "expert", spans the 8 devices of both islands, so half of every
exchange crosses from one island's worker to the other's; tokens are split
over the same axis. The whole step, optimizer included, is one program.

--plain runs the same on plain JAX (8 CPU devices in this process), to
compare: the losses are the same bits (tests/conformance/moe_test.py).
"""
from __future__ import annotations

import math
import sys
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_pathways

EXPERTS, TOP_K, CAPACITY_FACTOR = 8, 2, 1.25
IN, MODEL, HIDDEN, OUT = 16, 32, 64, 8
TOKENS = 512                    # per step, over all devices
STEPS = 24
AUX_WEIGHT = 1e-2               # load balancing: keeps experts in use

Params = dict[str, Any]


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
  """Batch `step`: inputs from 8 clusters, each with a target map of its
  own, so experts have something to specialize on."""
  task = np.random.default_rng(1234)
  centers = task.standard_normal((EXPERTS, IN)).astype(np.float32) * 2
  maps = task.standard_normal((EXPERTS, IN, OUT)).astype(np.float32) / 4
  rng = np.random.default_rng(step)
  cluster = rng.integers(0, EXPERTS, TOKENS)
  x = centers[cluster] + rng.standard_normal((TOKENS, IN)).astype(np.float32)
  y = np.tanh(np.einsum("ti,tio->to", x, maps[cluster]))
  return x, y.astype(np.float32)


def init(key: jax.Array) -> Params:
  ks = jax.random.split(key, 7)

  def dense(k: jax.Array, *shape: int) -> jax.Array:
    return jax.random.normal(k, shape) / math.sqrt(shape[-2])

  return {"embed": dense(ks[0], IN, MODEL),
          "mlp_in": dense(ks[1], MODEL, HIDDEN),
          "mlp_out": dense(ks[2], HIDDEN, MODEL),
          "router": dense(ks[3], MODEL, EXPERTS) * 0.1,
          "expert_in": dense(ks[4], EXPERTS, MODEL, HIDDEN),
          "expert_out": dense(ks[5], EXPERTS, HIDDEN, MODEL),
          "head": dense(ks[6], MODEL, OUT)}


def layer_norm(h: jax.Array) -> jax.Array:
  mean = h.mean(-1, keepdims=True)
  return (h - mean) * jax.lax.rsqrt(((h - mean) ** 2).mean(-1, keepdims=True)
                                    + 1e-5)


def route(logits: jax.Array, capacity: int
          ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Top-2 gating with a capacity per expert: (dispatch [T, E, C] 0/1,
  combine [T, E, C] gate weights, load-balancing loss, tokens dropped)."""
  gates = jax.nn.softmax(logits)                                 # [T, E]
  first = jax.nn.one_hot(jnp.argmax(gates, -1), EXPERTS, dtype=jnp.int32)
  rest = jnp.where(first > 0, -1.0, gates)
  second = jax.nn.one_hot(jnp.argmax(rest, -1), EXPERTS, dtype=jnp.int32)
  g1 = (gates * first).sum(-1)
  g2 = (gates * second).sum(-1)
  g1, g2 = g1 / (g1 + g2), g2 / (g1 + g2)
  # Slots in arrival order, first choices before second choices; a token
  # past an expert's capacity loses that choice.
  pos1 = jnp.cumsum(first, 0) - first
  pos2 = jnp.cumsum(second, 0) - second + first.sum(0)
  keep1 = first * (pos1 < capacity)
  keep2 = second * (pos2 < capacity)
  slot1 = jax.nn.one_hot((pos1 * keep1).sum(-1), capacity)       # [T, C]
  slot2 = jax.nn.one_hot((pos2 * keep2).sum(-1), capacity)
  dispatch1 = keep1[:, :, None] * slot1[:, None, :]
  dispatch2 = keep2[:, :, None] * slot2[:, None, :]
  combine = g1[:, None, None] * dispatch1 + g2[:, None, None] * dispatch2
  # Switch Transformer's auxiliary loss: fraction routed x mean gate.
  aux = EXPERTS * jnp.sum(first.mean(0) * gates.mean(0))
  dropped = (first.sum() - keep1.sum()) + (second.sum() - keep2.sum())
  return dispatch1 + dispatch2, combine, aux, dropped


def moe(mesh: Mesh, tokens_per_device: int) -> Callable[..., Any]:
  """The expert-parallel layer: tokens and experts split over "expert"."""
  capacity = math.ceil(CAPACITY_FACTOR * TOP_K * tokens_per_device / EXPERTS)

  def local(h: jax.Array, router: jax.Array, w_in: jax.Array,
            w_out: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    dispatch, combine, aux, dropped = route(h @ router, capacity)
    sent = jnp.einsum("tec,td->ecd", dispatch, h)                 # by expert
    # Row e of every device's buffer goes to device e: each device then
    # holds, by source device, the tokens its own expert takes.
    got = jax.lax.all_to_all(sent, "expert", 0, 0, tiled=True)
    out = jax.nn.gelu(got @ w_in[0]) @ w_out[0]
    back = jax.lax.all_to_all(out, "expert", 0, 0, tiled=True)
    return (jnp.einsum("tec,ecd->td", combine, back),
            jax.lax.pmean(aux, "expert"), jax.lax.psum(dropped, "expert"))

  return jax.shard_map(
      local, mesh=mesh,
      in_specs=(P("expert"), P(), P("expert"), P("expert")),
      out_specs=(P("expert"), P(), P()))


def train(devices: Sequence[jax.Device], steps: int = STEPS,
          on_step: Callable[[int, jax.Array, jax.Array], None] | None = None
          ) -> tuple[list[jax.Array], Params]:
  """Trains the model over `devices` (8: one expert each); returns every
  step's loss and the final parameters."""
  # jax.make_mesh refuses devices of several islands ("multi-slice");
  # a Mesh over them is one SPMD program on both islands' workers.
  mesh = Mesh(np.array(devices).reshape(EXPERTS), ("expert",))
  rows = NamedSharding(mesh, P("expert"))
  replicated = NamedSharding(mesh, P())
  layer = moe(mesh, TOKENS // EXPERTS)
  optimizer = optax.adam(3e-3)

  def loss_fn(params: Params, x: jax.Array, y: jax.Array
              ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    h = x @ params["embed"]
    h = h + jax.nn.gelu(layer_norm(h) @ params["mlp_in"]) @ params["mlp_out"]
    mixed, aux, dropped = layer(layer_norm(h), params["router"],
                                params["expert_in"], params["expert_out"])
    h = h + mixed
    loss = jnp.mean((h @ params["head"] - y) ** 2)
    return loss + AUX_WEIGHT * aux, (loss, dropped)

  @jax.jit
  def step(params, opt_state, x, y):
    grads, (loss, dropped) = jax.grad(loss_fn, has_aux=True)(params, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, dropped

  params = init(jax.random.key(0))
  params = {k: jax.device_put(v, rows if k.startswith("expert_")
                              else replicated) for k, v in params.items()}
  # Adam's step count starts as an uncommitted scalar, and step() returns
  # it on the mesh: put it there first, so that step() compiles once.
  opt_state = jax.tree.map(lambda a: a if a.ndim else
                           jax.device_put(a, replicated),
                           optimizer.init(params))
  losses = []
  for i in range(steps):
    x, y = batch(i)
    params, opt_state, loss, dropped = step(
        params, opt_state, jax.device_put(x, rows), jax.device_put(y, rows))
    losses.append(loss)
    if on_step:
      on_step(i, loss, dropped)
  return losses, params


def main() -> None:
  if "--plain" in sys.argv[1:]:
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", EXPERTS)
  else:
    jax_pathways.initialize()
  steps = (int(sys.argv[sys.argv.index("--steps") + 1])
           if "--steps" in sys.argv[1:] else STEPS)
  devices = jax.devices()
  print("experts on", ", ".join(
      f"device {d.id} (island {getattr(d, 'slice_index', 0)})"
      for d in devices))
  started = []

  def on_step(i: int, loss: jax.Array, dropped: jax.Array) -> None:
    if i == 0:  # the first step compiles; time the others
      loss.block_until_ready()
      started.append(time.perf_counter())
    if i % 5 == 0 or i == steps - 1:
      print(f"step {i:3d}  loss {float(loss):.4f}  dropped "
            f"{int(dropped)}/{TOKENS * TOP_K} choices", flush=True)

  losses, _ = train(devices, steps, on_step=on_step)
  elapsed = time.perf_counter() - started[0]
  print(f"loss {float(losses[0]):.4f} -> {float(losses[-1]):.4f}; "
        f"{1e3 * elapsed / (steps - 1):.1f} ms a step")


if __name__ == "__main__":
  main()
