"""Input batches made on the islands: a grain pipeline beside each island.

    pip install '.[examples]' && python examples/island_input.py

The usual input loop reads every batch in this process and uploads it to
the devices. Here each island's colocated Python process (the
`jax.experimental.colocated_python` class below, as MaxText's
RemoteIterator does) runs a grain pipeline over its share of the dataset
and hands its shards of each global batch straight to its devices: no
batch passes through this process. The same model is then trained from
this process on the same batches, and both runs' losses must be equal.
"""
import gc

import jax_pathways

jax_pathways.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.experimental import colocated_python as cp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

FEATURES, GLOBAL_BATCH, STEPS, EXAMPLES = 16, 64, 30, 4096
mesh = Mesh(np.array(jax.devices()), ("data",))  # both islands
batch = NamedSharding(mesh, P("data"))
replicated = NamedSharding(mesh, P())
islands = len({d.slice_index for d in jax.devices()})


def example(i: int) -> dict:
  """Example i of the dataset: features and a label, made from i alone."""
  rng = np.random.default_rng(i)
  x = rng.standard_normal(FEATURES).astype(np.float32)
  return {"x": x, "y": np.float32(x[:4].sum() > 0)}


def client_batches(step: int) -> tuple[np.ndarray, np.ndarray]:
  """The same batch, read in this process: island k's rows in order."""
  local = GLOBAL_BATCH // islands
  rows = [example(k + islands * (step * local + j))
          for k in range(islands) for j in range(local)]
  return (np.stack([r["x"] for r in rows]),
          np.array([r["y"] for r in rows], np.float32))


optimizer = optax.sgd(0.1)


@jax.jit
def train_step(w, opt_state, x, y):
  def loss_fn(w):
    return optax.sigmoid_binary_cross_entropy(x @ w, y).mean()
  loss, grads = jax.value_and_grad(loss_fn)(w)
  updates, opt_state = optimizer.update(grads, opt_state, w)
  return optax.apply_updates(w, updates), opt_state, loss


def train(next_batch) -> list[float]:
  w = jax.device_put(jnp.zeros(FEATURES), replicated)
  opt_state = jax.device_put(optimizer.init(w), replicated)
  losses = []
  for step in range(STEPS):
    x, y = next_batch(step)
    w, opt_state, loss = train_step(w, opt_state, x, y)
    losses.append(float(loss))
  return losses


def main() -> None:
  # Defined here so that it goes with main(): JAX's colocated_python_class
  # leaves a finalizer that fails if it first runs at interpreter exit
  # (plain JAX prints the same).
  @cp.colocated_python_class
  class IslandBatches:
    """In each island's colocated process: grain over that island's share
    (examples k, k + n, k + 2n, ... on island k of n), batched."""

    def __init__(self, local_batch: int) -> None:
      import grain  # pylint: disable=import-outside-toplevel
      share = grain.MapDataset.range(jax.process_index(), EXAMPLES,
                                     jax.process_count())
      self._batches = iter(share.map(example).batch(local_batch))

    def next(self, like: jax.Array) -> tuple[jax.Array, jax.Array]:
      """The next global batch, laid out as `like`: this island's rows."""
      b = next(self._batches)
      x_sharding = like.sharding
      y_sharding = NamedSharding(x_sharding.mesh, P("data"))
      return (jax.make_array_from_process_local_data(x_sharding, b["x"]),
              jax.make_array_from_process_local_data(y_sharding, b["y"]))

  like = jax.device_put(np.zeros((GLOBAL_BATCH, FEATURES), np.float32),
                        batch)
  remote = IslandBatches(GLOBAL_BATCH // islands)
  remote.next = remote.next.specialize(out_specs_fn=lambda like: (
      jax.ShapeDtypeStruct((GLOBAL_BATCH, FEATURES), np.float32,
                           sharding=batch),
      jax.ShapeDtypeStruct((GLOBAL_BATCH,), np.float32, sharding=batch)))
  on_islands = train(lambda step: remote.next(like))
  from_client = train(lambda step: [jax.device_put(a, batch)
                                    for a in client_batches(step)])
  for step in range(0, STEPS, 10):
    print(f"step {step:2d}  loss {on_islands[step]:.4f} (batches made on "
          f"the islands)  {from_client[step]:.4f} (read by this process)")
  print(f"final loss {on_islands[-1]:.4f}; both loops agree: "
        f"{on_islands == from_client}")


main()
gc.collect()  # (see main)
