"""The controller compiles a program once, whichever call site traced it:
JAX's client sends it again (with the Python stack in its locations, and
its options' maps in another order) each time it traces it anew, as
pathwaysutils' slice health check does on every poll."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jax_pathways import admin

pytestmark = pytest.mark.integration


def _compiled(cluster: Any) -> int:
  return admin.status(cluster.address, cluster.token)["compiles"]


def test_a_program_traced_again_elsewhere_compiles_once(pathways,
                                                        proxy_devices):
  # Sharded: the program carries Shardy's attributes too.
  mesh = Mesh(np.array(proxy_devices[:4]), ("i",))
  x = jax.device_put(np.linspace(-2, 2, 16, dtype=np.float32),
                     NamedSharding(mesh, P("i")))

  def traced() -> np.ndarray:
    # A new function each call: JAX traces, lowers and sends it again.
    return np.asarray(jax.jit(lambda a: jnp.sin(a) * 0.625 + 1.5)(x))

  before = _compiled(pathways)
  here = traced()
  there = [traced() for _ in range(2)]  # another Python stack
  assert _compiled(pathways) == before + 1
  assert all(t.tobytes() == here.tobytes() for t in there)
