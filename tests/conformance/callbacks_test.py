"""Callbacks into the user's process, as JAX code uses them: jax.debug.print
and jax.debug.callback, pure_callback and io_callback inside jit, vmap,
scan, while_loop, cond, grad and shard_map, on one island and across
islands; custom_partitioning and inspect_array_sharding while compiling.
Each runs plain (this process's CPU backend) and through jax_pathways: the
same results, bit for bit, the same calls in the same order where JAX
orders them, the same errors."""
from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

pytestmark = pytest.mark.integration

# Where a program runs: one device of island 1, island 0's four devices,
# and all eight devices of both islands.
PLACES = {"one_device": (5,), "one_island": (0, 1, 2, 3),
          "both_islands": tuple(range(8))}
WAIT_S = 60.0  # a bound on waits that only catches hangs


def _mesh(devices, place: str) -> Mesh:
  return Mesh(np.array([devices[i] for i in PLACES[place]]), ("d",))


def _put(devices, place: str, x) -> jax.Array:
  return jax.device_put(x, NamedSharding(_mesh(devices, place), P("d")))


@pytest.mark.parametrize("place", sorted(PLACES))
def test_callbacks_run_here_with_the_device_values(run_both, place):
  calls: dict[str, list] = {}

  def program(devices):
    seen = calls.setdefault(devices[0].platform + str(id(devices)), [])

    def record(s, m):
      seen.append((float(s), np.asarray(m).tolist()))

    @jax.jit
    def f(x):
      s = x.sum()
      jax.debug.callback(record, s, x.max())
      y = jax.pure_callback(lambda v: np.sin(v) * 3,
                            jax.ShapeDtypeStruct((), x.dtype), s)
      z = io_callback(lambda v: (v * 2).astype(v.dtype),
                      jax.ShapeDtypeStruct(x.shape, x.dtype), x)
      return x * y + z

    out = f(_put(devices, place, jnp.arange(16, dtype=jnp.float32)))
    jax.effects_barrier()
    return out

  run_both(program)
  plain, pathways = calls.values()
  assert plain == pathways == [(120.0, 15.0)]


def test_debug_print_prints_in_this_process(run_both, capfd):
  def program(devices):
    @jax.jit
    def step(x):
      for i in range(3):
        jax.debug.print("step {i}: {x}", i=i, x=x.sum())
        x = x * 2
      return x
    out = step(_put(devices, "both_islands", jnp.ones(8)))
    jax.effects_barrier()
    return out

  run_both(program)
  lines = [l for l in capfd.readouterr().out.splitlines()
           if l.startswith("step")]
  expected = ["step 0: 8.0", "step 1: 16.0", "step 2: 32.0"]
  assert lines == expected * 2  # plain, then through jax_pathways


@pytest.mark.parametrize("transform", ["vmap", "scan", "while", "cond",
                                       "grad", "shard_map"])
def test_pure_callback_under_transformations(run_both, transform):
  def host(x):
    return np.cos(x) * 2 + 1

  def cb(x):
    return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                             vmap_method="sequential")

  @jax.custom_jvp
  def g(x):
    return cb(x)

  g.defjvp(lambda p, t: (g(p[0]), -2 * jnp.sin(p[0]) * t[0]))

  def program(devices):
    x = _put(devices, "one_island", jnp.linspace(0, 1, 8, dtype=jnp.float32))
    mesh = _mesh(devices, "one_island")
    fns = {
        "vmap": jax.vmap(cb),
        "scan": lambda x: jax.lax.scan(lambda c, v: (c + cb(v), c), 0.0,
                                       x)[0],
        "while": lambda x: jax.lax.while_loop(
            lambda c: c[0] < 3, lambda c: (c[0] + 1, cb(c[1])), (0, x))[1],
        "cond": lambda x: jax.lax.cond(x.sum() > 1, cb, jnp.sin, x),
        "grad": jax.grad(lambda x: g(x).sum()),
        "shard_map": jax.shard_map(cb, mesh=mesh, in_specs=P("d"),
                                   out_specs=P("d")),
    }
    return jax.jit(fns[transform])(x)

  run_both(program)


def test_ordered_io_callbacks_keep_their_order(run_both):
  log: list[list[int]] = []

  def program(devices):
    order: list[int] = []
    log.append(order)

    def note(i):
      order.append(int(i))
      return np.int32(len(order))

    @jax.jit
    def f(x):
      def body(c, i):
        n = io_callback(note, jax.ShapeDtypeStruct((), jnp.int32), i,
                        ordered=True)
        return c + n, n
      return jax.lax.scan(body, 0, x)

    out = [f(_put(devices, "one_device", jnp.arange(6, dtype=jnp.int32) * k))
           for k in (1, 2)]
    jax.effects_barrier()
    return out

  run_both(program)
  assert log[0] == log[1] == [0, 1, 2, 3, 4, 5, 0, 2, 4, 6, 8, 10]


@pytest.mark.parametrize("place", sorted(PLACES))
def test_an_exception_in_a_callback_reaches_the_caller(proxy_devices, place):
  def boom(x):
    raise ValueError(f"no thanks to {float(x)}")

  @jax.jit
  def f(x):
    y = jax.pure_callback(boom, jax.ShapeDtypeStruct((), x.dtype), x.sum())
    return x * y

  x = _put(proxy_devices, place, jnp.arange(8, dtype=jnp.float32))
  with pytest.raises(Exception, match=r"ValueError: no thanks to 28\.0"):
    np.asarray(f(x))
  # The island is fine, and the program runs again once the callback does.
  ok = jax.jit(lambda x: jax.pure_callback(
      lambda v: v + 1, jax.ShapeDtypeStruct(x.shape, x.dtype), x))
  np.testing.assert_array_equal(np.asarray(ok(x)), np.arange(8) + 1)


def test_a_callback_may_call_jax_on_the_islands(proxy_devices):
  inner = jax.jit(lambda v: v * 10)

  def host(x):
    # On the cluster's own devices, while the outer program waits for us.
    return np.asarray(inner(jax.device_put(x, proxy_devices[5])))

  @jax.jit
  def f(x):
    return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype),
                             x) + 1

  for device in (proxy_devices[5], proxy_devices[1]):
    x = jax.device_put(np.arange(4, dtype=np.float32), device)
    np.testing.assert_array_equal(np.asarray(f(x)), np.arange(4) * 10 + 1)


@pytest.mark.parametrize("place", ["one_device", "one_island"])
def test_a_blocked_callback_holds_up_no_other_work(proxy_devices, place):
  started, release = threading.Event(), threading.Event()

  def wait_for_release(x):
    started.set()
    assert release.wait(WAIT_S), "the test never released the callback"
    return x

  blocked = jax.jit(lambda x: jax.pure_callback(
      wait_for_release, jax.ShapeDtypeStruct(x.shape, x.dtype), x) * 2)
  other = jax.jit(lambda x: jnp.cumsum(x) + 1)
  x = _put(proxy_devices, place, jnp.arange(8, dtype=jnp.float32))
  got: dict[str, jax.Array] = {}
  # (A call of one device returns once its callbacks ran, as on CPU.)
  calling = threading.Thread(target=lambda: got.setdefault("y", blocked(x)),
                             daemon=True)
  try:
    calling.start()
    assert started.wait(WAIT_S)
    # The same island takes other work meanwhile: uploads, programs (on one
    # device: XLA:CPU runs one program of several devices at a time) and
    # fetches; so does the other island, whatever it runs.
    for device in (proxy_devices[PLACES[place][-1]],
                   _mesh(proxy_devices, "one_island").devices[0]):
      y = jax.device_put(jnp.ones(8, jnp.float32), device)
      np.testing.assert_array_equal(np.asarray(other(y)), np.arange(8) + 2)
    other_island = Mesh(np.array(proxy_devices[4:]), ("d",))
    y = jax.device_put(jnp.ones(8, jnp.float32),
                       NamedSharding(other_island, P("d")))
    np.testing.assert_array_equal(np.asarray(other(y)), np.arange(8) + 2)
    assert not release.is_set()
  finally:
    release.set()
  calling.join(WAIT_S)
  np.testing.assert_array_equal(np.asarray(got["y"]), np.arange(8) * 2)


def test_calls_wait_for_their_callbacks_as_on_cpu(proxy_devices, cpu_devices):
  """Plain JAX on CPU runs a program with host callbacks on one device
  before the call returns, and raises the callback's error from the call;
  a program of several devices is dispatched ahead. So here, on each."""
  for devices in (cpu_devices, proxy_devices):
    ran: list[float] = []

    def record(v):
      time.sleep(0.2)  # long after a call that did not wait has returned
      ran.append(float(v.sum()))
      return v

    def refuse(v):
      raise ValueError(f"refused {float(v.sum())}")

    with jax.default_device(devices[0]):
      x = jnp.arange(4, dtype=jnp.float32)
      # io_callback has effects; pure_callback has none, so JAX's C++
      # dispatch takes its later calls.
      for called in (jax.jit(lambda v: io_callback(record, v, v) * 2),
                     jax.jit(lambda v: jax.pure_callback(
                         record, jax.ShapeDtypeStruct(v.shape, v.dtype),
                         v) * 2)):
        ran.clear()
        for i in range(3):  # the first call, then the later ones
          called(x + i)
          assert ran == [6.0 + 4 * k for k in range(i + 1)], devices[0]
      with pytest.raises(jax.errors.JaxRuntimeError, match="refused 6.0"):
        jax.jit(lambda v: io_callback(refuse, v, v))(x)
    # Several devices: the call returns while the callback still waits.
    entered, release = threading.Event(), threading.Event()

    def hold(v):
      entered.set()
      assert release.wait(WAIT_S)
      return v

    y = jax.device_put(jnp.arange(8, dtype=jnp.float32),
                       NamedSharding(Mesh(np.array(devices[:4]), ("d",)),
                                     P("d")))
    try:
      pending = jax.jit(lambda v: jax.pure_callback(
          hold, jax.ShapeDtypeStruct(v.shape, v.dtype), v) + 1)(y)
      assert entered.wait(WAIT_S) and not release.is_set()
    finally:
      release.set()
    np.testing.assert_array_equal(np.asarray(pending), np.arange(8) + 1)


def test_custom_partitioning_asks_this_process(run_both):
  calls: list[str] = []

  @custom_partitioning
  def double_rows(x):
    return x * 2

  def infer(mesh, arg_shapes, result_shape):
    calls.append("infer")
    return arg_shapes[0].sharding

  def partition(mesh, arg_shapes, result_shape):
    calls.append("partition")
    sharding = arg_shapes[0].sharding
    return mesh, lambda x: x * 2, sharding, (sharding,)

  double_rows.def_partition(infer_sharding_from_operands=infer,
                            partition=partition, sharding_rule="i j -> i j")

  def program(devices):
    x = jax.device_put(jnp.arange(64, dtype=jnp.float32).reshape(16, 4),
                       NamedSharding(_mesh(devices, "both_islands"),
                                     P("d", None)))
    return jax.jit(lambda x: double_rows(x) + 1)(x)

  run_both(program)
  # Once plain; once through jax_pathways, though both islands compiled it.
  assert calls == ["partition", "partition"]


def test_custom_partitioning_errors_read_as_in_jax(proxy_devices):
  @custom_partitioning
  def f(x):
    return x

  f.def_partition(
      infer_sharding_from_operands=lambda mesh, a, r: a[0].sharding,
      partition=lambda mesh, a, r: (mesh, lambda x: x[:1], a[0].sharding,
                                    (a[0].sharding,)),
      sharding_rule="i -> i")
  x = _put(proxy_devices, "both_islands", jnp.arange(16, dtype=jnp.float32))
  with pytest.raises(Exception, match="Mismatch in result shapes"):
    jax.jit(f)(x)


def test_inspect_array_sharding_is_called_once_per_compile(run_both):
  seen: list[str] = []

  def program(devices):
    @jax.jit
    def f(x):
      jax.debug.inspect_array_sharding(x, callback=lambda s: seen.append(
          str(s.spec)))
      return x + 1
    return f(_put(devices, "both_islands", jnp.arange(16.)))

  run_both(program)
  assert seen == ["P('d',)"] * 2


def _nested_module(depth: int) -> bytes:
  """A partitioned program `depth` regions deep (MLIR reads one stack frame
  per level: deep enough, it overflows any thread that reads it)."""
  body, tail = [], []
  for i in range(depth, 0, -1):
    body.append(f"%p{i} = stablehlo.constant dense<0> : tensor<i32>")
    body.append(f'%r{i} = "stablehlo.case"(%p{i}) ({{')
  for i in range(1, depth + 1):
    tail.append("}) : (tensor<i32>) -> tensor<f32>")
    if i < depth:
      tail.append(f"stablehlo.return %r{i} : tensor<f32>")
  return ("module @m {\n func.func public @main(%arg0: tensor<4xf32>) -> "
          "tensor<4xf32> {\n" + "\n".join(body) +
          "\n%v = stablehlo.constant dense<1.0> : tensor<f32>\n"
          "stablehlo.return %v : tensor<f32>\n" + "\n".join(tail) +
          "\nreturn %arg0 : tensor<4xf32>\n }\n}").encode()


_SPLAT = (b"module @m {\n func.func public @main(%arg0: tensor<4xf32>) -> "
          b"tensor<4xf32> {\n %c = stablehlo.constant dense<1.0> : "
          b"tensor<4194304x4194304xf32>\n return %arg0 : tensor<4xf32>\n }\n}")


@pytest.mark.parametrize("module, refused", [
    (_nested_module(20_000), "could not be read"),
    (_SPLAT, "has a value of 70368744177664 bytes"),
])
def test_a_hostile_partition_answer_reaches_no_worker(pathways, proxy_devices,
                                                      monkeypatch, module,
                                                      refused):
  """A client's partitioner answers with a program 20,000 regions deep
  (which killed the worker reading it), or one with a 64 TiB value: it is
  read in a reader process first and refused there, the workers live on."""
  from jax._src import custom_partitioning as cp  # pylint: disable=import-outside-toplevel
  real = cp._custom_partitioning_partition  # pylint: disable=protected-access

  def hostile(*args):
    _, arg_shardings, result_sharding = real(*args)
    return module, arg_shardings, result_sharding

  monkeypatch.setattr(cp, "_custom_partitioning_partition", hostile)

  @custom_partitioning
  def f(x):
    return x + 1

  f.def_partition(
      infer_sharding_from_operands=lambda mesh, a, r: a[0].sharding,
      partition=lambda mesh, a, r: (mesh, lambda x: x + 1, a[0].sharding,
                                    (a[0].sharding,)),
      sharding_rule="i -> i")
  pids = pathways.pids
  x = _put(proxy_devices, "both_islands", jnp.arange(16, dtype=jnp.float32))
  with pytest.raises(Exception, match=refused):
    jax.jit(f)(x)
  assert pathways.pids == pids
  monkeypatch.undo()
  np.testing.assert_array_equal(np.asarray(jax.jit(lambda v: v * 3)(x)),
                                np.arange(16) * 3)


def test_a_callback_of_too_many_bytes_is_refused_by_name(proxy_devices):
  """A callback's operands past what one message to the client carries
  fail its call with why, before any byte leaves the worker; the island
  and the client go on (issue 53 row 6)."""
  called = []

  @jax.jit
  def f(x):
    big = jnp.broadcast_to(x, (65 << 20,))  # 260 MiB of float32
    return jax.pure_callback(lambda b: called.append(1) or b[:1],
                             jax.ShapeDtypeStruct((1,), x.dtype), big)

  x = jax.device_put(jnp.ones((), jnp.float32), proxy_devices[5])
  with pytest.raises(jax.errors.JaxRuntimeError,
                     match="operands are more than 256 MiB"):
    f(x)
  assert not called
  ok = jax.jit(lambda v: jax.pure_callback(
      lambda a: a + 1, jax.ShapeDtypeStruct(v.shape, v.dtype), v))
  np.testing.assert_array_equal(np.asarray(ok(jnp.arange(3.0))),
                                np.arange(3.0) + 1)
