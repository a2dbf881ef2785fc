"""The rank-order rewrite, in this process: what it rewrites, what it keeps,
and that the rewritten program computes the same bits (the in-process
all-reduce already adds in rank order, so nothing may change here; across
islands, tests/conformance/islands_test.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import compiler
from jax._src.interpreters import mlir
from jax._src.lib import xla_client as xc
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jax_pathways.worker import order_reductions


def _compile_both(fn, devices, *args):
  """(as compiled by JAX, rewritten, how many collectives were rewritten)."""
  lowered = jax.jit(fn).lower(*args)
  program = mlir.module_to_bytecode(lowered.compiler_ir("stablehlo"))
  assignment = np.array([d.id for d in devices]).reshape(1, -1)

  def options():
    return compiler.get_compile_options(
        num_replicas=1, num_partitions=len(devices),
        device_assignment=assignment, backend=devices[0].client)

  client, device_list = devices[0].client, xc.DeviceList(tuple(devices))
  original, dumped = order_reductions.partitioned_module(
      lambda opts: client.compile_and_load(program, device_list, opts),
      options())
  text, rewritten = order_reductions.order_reductions(
      mlir.make_ir_context(), dumped)
  if not rewritten:
    return original, None, 0
  runner = client.compile_and_load(
      text.encode(), device_list,
      order_reductions.partitioned_options(options()))
  return original, runner, rewritten


def _run(executable, args):
  outputs = executable.execute_sharded(list(args))
  return [[np.asarray(s) for s in out]
          for out in outputs.disassemble_into_single_device_arrays()]


def test_float_reductions_become_exchanges_with_the_same_bits(cpu_devices):
  mesh = Mesh(np.array(cpu_devices).reshape(2, 4), ("a", "b"))
  rng = np.random.default_rng(5)
  x = jax.device_put(
      (rng.standard_normal((64, 8)) * 10.0 ** rng.integers(-4, 5, (64, 8))
       ).astype(np.float32), NamedSharding(mesh, P(("a", "b"))))

  # Not a multiple of 8 elements: the chunks are padded.
  big = jax.device_put(
      rng.standard_normal((64, 17001)).astype(np.float32),
      NamedSharding(mesh, P(("a", "b"))))

  def fn(v, w):
    return (v.sum(axis=0), jnp.mean(v * v, axis=0),
            v.astype(jnp.bfloat16).sum(0), w.sum(axis=0))

  original, runner, rewritten = _compile_both(fn, cpu_devices, x, big)
  assert rewritten == 4
  text = runner.hlo_modules()[0].to_string()
  assert "all-to-all" in text and "all-gather" in text
  assert "all-reduce" not in text
  for want, got in zip(_run(original, [x, big]), _run(runner, [x, big])):
    for w, g in zip(want, got):
      assert w.tobytes() == g.tobytes()


def test_reduce_scatter_keeps_each_participants_block(cpu_devices):
  mesh = Mesh(np.array(cpu_devices).reshape(2, 4), ("a", "b"))
  rng = np.random.default_rng(6)
  x = jax.device_put(rng.standard_normal((64, 8)).astype(np.float32) * 1e3,
                     NamedSharding(mesh, P(("a", "b"))))
  fn = jax.shard_map(lambda v: (jax.lax.psum_scatter(v, "a", tiled=True),
                                jax.lax.psum_scatter(v, "b", tiled=True)),
                     mesh=mesh, in_specs=P(("a", "b")),
                     out_specs=(P(("a", "b")), P(("a", "b"))))
  original, runner, rewritten = _compile_both(fn, cpu_devices, x)
  assert rewritten == 2
  assert "reduce-scatter" not in runner.hlo_modules()[0].to_string()
  for want, got in zip(_run(original, [x]), _run(runner, [x])):
    for w, g in zip(want, got):
      assert w.tobytes() == g.tobytes()


def test_exact_reductions_are_left_alone(cpu_devices):
  """Integer sums and float max are the same in any order: no rewrite, no
  second compile."""
  mesh = Mesh(np.array(cpu_devices), ("i",))
  x = jax.device_put(np.arange(64, dtype=np.int32).reshape(8, 8),
                     NamedSharding(mesh, P("i")))
  _, runner, rewritten = _compile_both(
      lambda v: (v.sum(axis=0), v.astype(jnp.float32).max(axis=0)),
      cpu_devices, x)
  assert rewritten == 0 and runner is None


def test_softmax_gradient_keeps_its_bits(cpu_devices):
  """A replicated weight's gradient over sharded rows (one float
  all-reduce, rewritten): the rest of the program keeps its bits. Rewritten
  right after the partitioner, it did not: through StableHLO the module
  lost the partitioner's reshape chains, and XLA's simplifier then kept
  softmax's exp/sum a divide where the first compile made it exp*(1/sum)."""
  mesh = Mesh(np.array(cpu_devices), ("i",))
  rng = np.random.default_rng(0)
  x = jax.device_put(rng.standard_normal((512, 32)).astype(np.float32),
                     NamedSharding(mesh, P("i")))
  w = jax.device_put(rng.standard_normal((32, 8)).astype(np.float32),
                     NamedSharding(mesh, P()))
  fn = jax.grad(lambda w, x: jnp.sum(jax.nn.softmax(x @ w) ** 2))
  original, runner, rewritten = _compile_both(fn, cpu_devices, w, x)
  assert rewritten == 1
  for want, got in zip(_run(original, [w, x]), _run(runner, [w, x])):
    for w_, g in zip(want, got):
      assert w_.tobytes() == g.tobytes()


def test_groups_over_a_transposed_mesh_are_not_rewritten(cpu_devices):
  """A (data, model) mesh's "model" axis groups devices 0-3 and 4-7, which
  HLO writes as axes of a mesh in transposed device order; the StableHLO
  translation drops that order, and the program compiled from it summed and
  gathered over devices 0, 2, 4, 6 (8000.0 for this sum of 0..127, not
  8128.0). Such a program is not rewritten: it keeps gloo's order."""
  mesh = jax.make_mesh((2, 4), ("data", "model"), devices=cpu_devices)
  g = jax.device_put(np.arange(128, dtype=np.float32).reshape(16, 8),
                     NamedSharding(mesh, P(None, "model")))

  def fn(v):
    return v.sum(), jax.lax.with_sharding_constraint(
        v * 2, NamedSharding(mesh, P()))

  with pytest.raises(order_reductions.NotRewritten,
                     match="mesh not in iota order"):
    _compile_both(fn, cpu_devices, g)
