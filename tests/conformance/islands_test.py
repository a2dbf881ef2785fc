"""Two islands in one program: placement, moves between them, clear errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

pytestmark = pytest.mark.integration


def test_devices_name_their_island(proxy_devices):
  assert [d.slice_index for d in proxy_devices] == [0] * 4 + [1] * 4
  assert [d.island for d in proxy_devices] == [0] * 4 + [1] * 4
  assert [d.island_local_index for d in proxy_devices] == [0, 1, 2, 3] * 2
  assert "island 1" in proxy_devices[5].worker
  assert proxy_devices[0].platform == "cpu"
  assert jax.device_count() == 8 and jax.process_count() == 1
  # What colocated_python (orbax's and MaxText's dispatchers) runs beside
  # a device: the device itself, not the CPU device of its rank.
  from jax.experimental.colocated_python import colocated_cpu_devices  # pylint: disable=import-outside-toplevel
  assert colocated_cpu_devices(proxy_devices[5:7]) == proxy_devices[5:7]


def test_programs_on_both_islands_interleaved(run_both):
  def program(devices):
    meshes = [Mesh(np.array(devices[4 * i:4 * i + 4]), ("i",)) for i in (0, 1)]
    shard = [NamedSharding(m, P("i")) for m in meshes]
    f = jax.jit(lambda a: jnp.cumsum(a * 1.5, axis=0))
    g = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "i"), mesh=meshes[1],
                              in_specs=P("i"), out_specs=P("i")))
    a = jax.device_put(jnp.arange(32.0).reshape(8, 4), shard[0])
    b = jax.device_put(jnp.arange(32.0).reshape(8, 4) * -1, shard[1])
    outs = []
    for step in range(5):
      a = f(a)                      # island 0
      b = g(b) / 4 + step           # island 1
      b = jax.device_put(b, shard[1])
      outs.append((a.sum(), b))
    return outs
  run_both(program)


def test_device_put_across_islands_and_back(run_both):
  def program(devices):
    x = jax.random.normal(jax.random.key(3), (16, 8))
    m0 = Mesh(np.array(devices[:4]), ("i",))
    m1 = Mesh(np.array(devices[4:]), ("i",))
    a = jax.device_put(x, NamedSharding(m0, P("i")))
    b = jax.device_put(a, NamedSharding(m1, P(None, "i")))  # move + reshard
    c = jax.jit(lambda v: v @ v.T)(b)                        # runs on island 1
    d = jax.device_put(c, devices[2])                         # back to island 0
    e = jax.device_put(jax.device_put(d, devices[7]), devices[0])
    assert b.sharding.mesh.devices.flat[0] == devices[4]
    assert d.devices() == {devices[2]}
    return b, c, d, e
  run_both(program)


def test_data_parallel_jit_over_both_islands(run_both):
  """One SPMD program over all 8 devices of 2 islands, gloo between the
  island workers, the same bits as one host: its float reductions add in
  rank order (worker/order_reductions.py)."""
  def program(devices):
    mesh = Mesh(np.array(devices), ("data",))
    batch = NamedSharding(mesh, P("data"))
    rep = NamedSharding(mesh, P())
    rng = np.random.default_rng(7)
    x = jax.device_put(rng.standard_normal((64, 16)).astype(np.float32), batch)
    y = jax.device_put(rng.standard_normal((64, 1)).astype(np.float32), batch)
    w = jax.device_put(np.zeros((16, 1), np.float32), rep)

    @jax.jit
    def step(w, x, y):
      loss, g = jax.value_and_grad(
          lambda w: jnp.mean((x @ w - y) ** 2))(w)
      return w - 0.1 * g, loss

    losses = []
    for _ in range(5):
      w, loss = step(w, x, y)
      losses.append(loss)
    assert w.sharding.mesh.devices.size == 8
    return losses, w
  run_both(program)


def test_data_and_model_parallel_training_across_islands(run_both):
  """A 4-layer MLP on a (data 4, model 2) mesh over both islands: gradient
  all-reduces over 'data' cross islands, activations' over 'model' do
  not."""
  def program(devices):
    mesh = Mesh(np.array(devices).reshape(4, 2), ("data", "model"))
    rng = np.random.default_rng(1)
    ws = [jax.device_put(rng.standard_normal((32, 32)).astype(np.float32) * .2,
                         NamedSharding(mesh, P(None, "model")))
          for _ in range(4)]
    x = jax.device_put(rng.standard_normal((64, 32)).astype(np.float32),
                       NamedSharding(mesh, P("data")))

    @jax.jit
    def step(ws, x):
      def loss(ws):
        h = x
        for w in ws:
          h = jnp.tanh(h @ w)
        return jnp.mean(h ** 2)
      value, grads = jax.value_and_grad(loss)(ws)
      return [w - 0.5 * g for w, g in zip(ws, grads)], value

    losses = []
    for _ in range(3):
      ws, value = step(ws, x)
      losses.append(value)
    return losses, ws
  run_both(program)


def test_float_reductions_across_islands_add_in_rank_order(run_both):
  """psum, pmean, psum_scatter, sums and products over a sharded axis
  (f32, bf16, f16), on values whose float sum depends on the order of the
  terms."""
  rng = np.random.default_rng(2)
  values = (rng.standard_normal((64, 16)) *
            10.0 ** rng.integers(-4, 5, (64, 16))).astype(np.float32)
  parts = values.reshape(8, 8, 16).sum(axis=1)
  in_order, backwards = parts[0].copy(), parts[7].copy()
  for i in range(1, 8):
    in_order, backwards = in_order + parts[i], backwards + parts[7 - i]
  assert not np.array_equal(in_order, backwards)  # the order shows

  def program(devices):
    mesh = Mesh(np.array(devices).reshape(2, 4), ("a", "b"))
    x = jax.device_put(values, NamedSharding(mesh, P(("a", "b"))))
    f = jax.jit(jax.shard_map(
        lambda v: (jax.lax.psum(v, ("a", "b")), jax.lax.pmean(v, "a"),
                   jax.lax.psum_scatter(v, ("a", "b"), tiled=True),
                   jax.lax.psum_scatter(v, "a", tiled=True),
                   jax.lax.psum(v.astype(jnp.bfloat16), "b")),
        mesh=mesh, in_specs=P(("a", "b")),
        out_specs=(P(), P("b"), P(("a", "b")), P(("a", "b")), P("a"))))
    # 80 KB per device.
    wide = jax.device_put(np.tile(values, (1, 1250)),
                          NamedSharding(mesh, P(("a", "b"))))
    g = jax.jit(lambda v: (
        v.sum(axis=0), jnp.prod(1 + v * 1e-6, axis=0),
        jnp.prod((1 + v * 1e-3).astype(jnp.bfloat16), axis=0),
        v.astype(jnp.float16).sum(axis=0)))
    return f(x), g(x), jax.jit(lambda v: v.sum(axis=0))(wide)
  run_both(program)


def test_collectives_across_islands(run_both):
  def program(devices):
    mesh = Mesh(np.array(devices), ("i",))
    x = jax.device_put(jnp.arange(32.0).reshape(8, 4),
                       NamedSharding(mesh, P("i")))
    f = jax.jit(jax.shard_map(
        lambda a: (jax.lax.psum(a, "i"),
                   jax.lax.ppermute(a, "i", [(j, (j + 3) % 8) for j in range(8)]),
                   jax.lax.all_gather(a, "i", tiled=True)[None]),
        mesh=mesh, in_specs=P("i"), out_specs=(P(), P("i"), P("i"))))
    return f(x)
  run_both(program)


def test_arrays_move_between_island_and_spanning_layouts(run_both):
  def program(devices):
    mesh = Mesh(np.array(devices), ("i",))
    m1 = Mesh(np.array(devices[4:]), ("i",))
    x = jax.random.normal(jax.random.key(1), (16, 8))
    a = jax.device_put(x, NamedSharding(m1, P("i")))          # island 1
    b = jax.device_put(a, NamedSharding(mesh, P("i")))        # both islands
    c = jax.device_put(b, NamedSharding(mesh, P(None, "i")))  # reshard: host
    d = jax.device_put(c, devices[2])                         # island 0
    e = jax.device_put(b, NamedSharding(mesh, P()))           # replicated
    return b, c, d, e, [np.asarray(s.data) for s in b.addressable_shards]
  run_both(program)


def test_a_step_over_a_data_model_mesh_with_two_callbacks(run_both, capfd):
  """The mesh jax.make_mesh((2, 4)) gives over both islands (a row per
  island), weights sharded over 'model': the partitioner groups 'model' as
  axes of a mesh in transposed device order, which the rank-order rewrite
  read as another order (wrong sums and gathers, a NaN after two steps);
  with two callbacks beside it, as a training step has them."""
  def program(devices):
    mesh = Mesh(np.array(devices).reshape(2, 4), ("data", "model"))
    w = jax.device_put(np.ones((16, 8), np.float32) / 16,
                       NamedSharding(mesh, P(None, "model")))
    x = jax.device_put(np.arange(128, dtype=np.float32).reshape(8, 16) / 128,
                       NamedSharding(mesh, P("data")))

    @jax.jit
    def step(w, x):
      loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w) ** 2))(w)
      jax.debug.print("loss {l}", l=loss)
      g = io_callback(lambda a, b: a * 2,
                      jax.ShapeDtypeStruct(g.shape, g.dtype), g, x)
      loss = jax.pure_callback(lambda a, b: a + b,
                               jax.ShapeDtypeStruct((), loss.dtype), loss, loss)
      return w - 0.1 * g, loss, g.sum()

    out = []
    for _ in range(3):
      w, loss, total = step(w, x)
      out.append((loss, total))
    jax.effects_barrier()
    return w, out

  run_both(program)
  printed = [l for l in capfd.readouterr().out.splitlines()
             if l.startswith("loss")]
  assert len(printed) == 6 and printed[:3] == printed[3:]


def test_sums_and_gathers_over_the_model_axis_of_a_row_per_island_mesh(
    run_both):
  """The same mesh with no callbacks: a sum over 'model' and a gather to
  replicated read other devices' shards before (8000.0 for 0..127)."""
  def program(devices):
    mesh = Mesh(np.array(devices).reshape(2, 4), ("data", "model"))
    g = jax.device_put(np.arange(128, dtype=np.float32).reshape(16, 8),
                       NamedSharding(mesh, P(None, "model")))
    return jax.jit(lambda v: (v.sum(), jax.lax.with_sharding_constraint(
        v * 2, NamedSharding(mesh, P()))))(g)
  run_both(program)
