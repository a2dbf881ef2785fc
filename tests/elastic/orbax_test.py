"""Orbax checkpoints of a sharded train state through jax_pathways, on the
session's cluster: saved from a mesh spanning both islands, restored bit for
bit onto the same sharding, another one, and the other island alone.
(Restoring one after a worker loss and training on: pathwaysutils_test.)"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

pytestmark = pytest.mark.integration

TX = optax.adam(1e-2)


def _sharding(mesh: Mesh, spec: P, leaf: Any) -> NamedSharding:
  """Of a train-state leaf: matrices by `spec`, the rest replicated."""
  return NamedSharding(mesh, spec if np.ndim(leaf) == 2 else P())


def _bits(tree: Any) -> Any:
  return jax.tree.map(
      lambda a: (np.asarray(a).dtype, np.shape(a), np.asarray(a).tobytes()),
      tree)


def _devices(cluster: Any) -> np.ndarray:
  """islands x devices per island."""
  return np.array(jax.devices()).reshape(cluster.islands,
                                         cluster.devices_per_island)


@pytest.fixture(scope="module")
def saved(pathways, tmp_path_factory) -> tuple[str, dict[str, Any]]:
  """A train state after two Adam steps, sharded over all devices of both
  islands (model axis within an island), saved; with its values on the
  host."""
  mesh = Mesh(_devices(pathways), ("data", "model"))
  rng = np.random.default_rng(0)
  params = {"w": rng.normal(size=(16, 8)).astype(np.float32),
            "b": np.zeros(8, np.float32)}
  state = {"params": params, "opt": TX.init(params)}
  state = jax.tree.map(
      lambda a: jax.device_put(a, _sharding(mesh, P("data", "model"), a)),
      state)

  @jax.jit
  def step(state: dict[str, Any], x: jax.Array) -> dict[str, Any]:
    grads = jax.grad(lambda p: jnp.mean((x @ p["w"] + p["b"]) ** 2))(
        state["params"])
    updates, opt = TX.update(grads, state["opt"], state["params"])
    return {"params": optax.apply_updates(state["params"], updates),
            "opt": opt}

  x = rng.normal(size=(4, 16)).astype(np.float32)
  for _ in range(2):
    state = step(state, x)
  path = str(tmp_path_factory.mktemp("orbax") / "state")
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(path, state)
  checkpointer.wait_until_finished()
  return path, jax.device_get(state)


@pytest.mark.parametrize("where", [
    "same",            # the sharding it was saved from
    "transposed",      # both islands, axes swapped
    "island1",         # island 1's devices only, sharded
    "island0_replicated",
])
def test_restore_bit_identical(pathways, saved, where):
  path, expected = saved
  devices = _devices(pathways)
  mesh, spec, islands = {
      "same": (Mesh(devices, ("data", "model")), P("data", "model"), {0, 1}),
      "transposed": (Mesh(devices, ("data", "model")), P("model", "data"),
                     {0, 1}),
      "island1": (Mesh(devices[1].reshape(2, 2), ("a", "b")), P("b", "a"),
                  {1}),
      "island0_replicated": (Mesh(devices[0], ("a",)), P(), {0}),
  }[where]
  abstract = jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                     sharding=_sharding(mesh, spec, a)),
      expected)
  restored = ocp.StandardCheckpointer().restore(path, abstract)
  assert _bits(jax.device_get(restored)) == _bits(expected)
  for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(abstract)):
    assert got.sharding == want.sharding
    assert {d.slice_index for d in got.sharding.device_set} == islands
