"""One client's compile, however long, holds no other client's: an island
compiles programs side by side (issue 53 row 5)."""
from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

pytestmark = pytest.mark.integration


def test_a_compile_that_waits_holds_no_other_clients_compile(
    proxy_devices, start_client):
  """This client's compile waits in the worker, as long as its partitioner
  (called back while XLA compiles) takes; another client compiles and runs
  a program of its own on the same island meanwhile."""
  entered, release = threading.Event(), threading.Event()

  @custom_partitioning
  def double(x):
    return x * 2

  def partition(mesh, arg_shapes, result_shape):
    entered.set()
    release.wait(180)
    sharding = arg_shapes[0].sharding
    return mesh, lambda x: x * 2, sharding, (sharding,)

  double.def_partition(
      infer_sharding_from_operands=lambda mesh, a, r: a[0].sharding,
      partition=partition, sharding_rule="i -> i")
  island0 = Mesh(np.array(proxy_devices[:4]), ("d",))
  x = jax.device_put(jnp.arange(16, dtype=jnp.float32),
                     NamedSharding(island0, P("d")))
  got: dict[str, np.ndarray] = {}
  slow = threading.Thread(target=lambda: got.setdefault(
      "y", np.asarray(jax.jit(lambda v: double(v) + 1)(x))), daemon=True)
  slow.start()
  try:
    assert entered.wait(120), "the partitioner was never asked"
    # A program no one compiled before (its constant), on island 0.
    other = start_client(devices=4, island=0, steps=1,
                         offset=time.monotonic_ns() % 10_000 + 0.5)
    assert other.read("step", timeout=150)["ok"]
    assert slow.is_alive() and not got  # still compiling meanwhile
  finally:
    release.set()
  slow.join(120)
  np.testing.assert_array_equal(got["y"], np.arange(16) * 2 + 1)
