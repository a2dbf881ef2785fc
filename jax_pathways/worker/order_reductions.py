"""Makes programs that span islands add in the order one host would.

XLA's in-process CPU all-reduce combines the participants' values in rank
order, x0 + x1 + ... + x(n-1) (checked bit for bit), so a data-parallel
program on one host with 8 devices has one answer. Between processes the
global client's collectives go over gloo, whose ring all-reduce starts each
chunk at another rank: the same program over two islands differs in the last
bits of every float sum. This pass fixes the order without touching gloo:

  1. compile the program as usual, with XLA dumping the per-device module
     after its SPMD partitioner and its first simplification passes
     (collectives explicit, the algebra already simplified);
  2. rewrite each floating-point add/multiply reduce-scatter in it into an
     all-to-all (participant r receives everyone's r-th block; exact, it
     only copies) and the combine of those n blocks in rank order; and each
     such all-reduce into the same over chunks of the flattened value,
     followed by an all-gather of the combined chunks. Not an all-gather
     of the whole values combined after it, even for small ones: XLA fuses
     such a combine into the result's users, and there LLVM contracts
     another multiply into an FMA than where the result is read from the
     collective's buffer, as in the plain program (Adam's
     0.001*g*g + 0.999*nu then rounds otherwise);
  3. compile the result as an already partitioned program (every parameter
     and result {manual}, so the partitioner leaves it as it is), with the
     simplification passes that already ran turned off.

Why not dump right after the partitioner: the second compile reads the
module as StableHLO, whose import into HLO folds the reshape chains the
partitioner wrote, and on that input XLA's simplifier decides otherwise
than in the first compile (a softmax's exp/sum stays a divide instead of
exp*(1/sum); gelu's constants fold further): other bits, everywhere. Past
those passes, and with them off the second time, the rest of the pipeline
sees much what it saw the first time; not always all of it (an Adam step
over islands still differs in last bits: docs/limitations.md).

Cost: the rewritten collectives move as many bytes as gloo's ring does, in
two rounds instead of 2(n-1) steps; the program is compiled twice
(once, then cached). Integer, min and max reductions are exact in any order
and are left to gloo, as are programs with several replicas.
"""
from __future__ import annotations

import functools
import glob
import hashlib
import os
import pathlib
import re
import shutil
import tempfile
from typing import Any, Callable

import numpy as np
from jax._src.lib import _jax
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import hlo

from jax_pathways.wire import protos

# The combines whose result depends on the order of the operands.
_COMBINES = {"stablehlo.add": hlo.AddOp, "stablehlo.multiply": hlo.MulOp}
_REDUCTIONS = ("stablehlo.all_reduce", "stablehlo.reduce_scatter")
# The CPU compiler's passes, in pipeline order, whose result is dumped: the
# last one that changed the module gives the module to rewrite. The
# simplifying ones are not run again on it (they are not idempotent on a
# module that went through StableHLO; see the module docstring).
_DUMPED_PASSES = ("spmd-partitioning", "simplification",
                  "post_scatter_expansion_simplification")
_NOT_AGAIN = _DUMPED_PASSES[1:]


@functools.cache
def rewrite_version() -> bytes:
  """What a rank-ordered program kept in the compilation cache depends on
  besides its own bytes: this module's rewriting."""
  return hashlib.sha256(pathlib.Path(__file__).read_bytes()).digest()


class NotRewritten(Exception):
  """The program could not be taken apart; it runs with gloo's order."""


def partitioned_module(compile_with: Callable[[Any], Any], options: Any
                       ) -> tuple[Any, str | None]:
  """Compiles the program as usual (`compile_with(options)`) and returns
  (executable, the per-device module as XLA dumped it after the last of
  `_DUMPED_PASSES` that changed it, or None if it wrote none)."""
  dump = tempfile.mkdtemp(prefix="jax_pathways_partitioned_")
  try:
    # A copy: dump options left on would, with no directory, dump to stdout.
    options = _copy(options)
    debug = options.executable_build_options.debug_options
    debug.xla_dump_to = dump
    debug.xla_dump_hlo_pass_re = "^(%s)$" % "|".join(_DUMPED_PASSES)
    debug.xla_dump_hlo_as_proto = True
    debug.xla_dump_hlo_as_text = False
    executable = compile_with(options)
    # module_N.name.SEQ.pipeline.after_PASS.before_NEXT.hlo.pb
    after = re.compile(r"\.(\d+)\.[^.]+\.after_(%s)\.before_" %
                       "|".join(_DUMPED_PASSES))
    found = sorted((int(m.group(1)), f)
                   for f in glob.glob(os.path.join(dump, "*.pb"))
                   if (m := after.search(os.path.basename(f))))
    if not found:
      return executable, None
    with open(found[-1][1], "rb") as f:
      dumped = f.read()
  finally:
    shutil.rmtree(dump, ignore_errors=True)
  return executable, dumped


def order_reductions(context: ir.Context, dumped: bytes, replicas: int = 1,
                     aliases: dict[int, int] | None = None
                     ) -> tuple[str, int]:
  """Rewrites the float add/multiply all-reduces and reduce-scatters of a
  partitioned module (see the module docstring); returns (the program to
  compile with `partitioned_options`, how many collectives were
  rewritten). `aliases` (parameter -> the result it is reused for) are the
  original compile's: the module dumped before XLA chose them has only
  donors, which the rewritten program would otherwise lose."""
  if replicas != 1:  # collective ids would not all be partition ids
    return "", 0
  hlo_module = _hlo_module(dumped)
  text = _jax.mlir.hlo_to_stablehlo(hlo_module.SerializeToString())
  with context, ir.Location.unknown():
    module = ir.Module.parse(text)
    meshes = _meshes(module)
    rewritten = sum(_rewrite(op, meshes)
                    for op in _reductions(module.operation))
    if rewritten:  # else the program runs as first compiled: nothing to check
      _check_device_orders(hlo_module)
      _mark_manual(module, aliases or {})
      module.operation.verify()
    return str(module), rewritten


def partitioned_options(options: Any) -> Any:
  """A copy of `options` for a program that is already partitioned and
  simplified."""
  options = _copy(options)
  build = options.executable_build_options
  build.use_spmd_partitioning = True
  build.use_shardy_partitioner = False  # it reads {manual} shardings
  debug = build.debug_options
  debug.xla_disable_hlo_passes = ",".join(
      [p for p in debug.xla_disable_hlo_passes.split(",") if p] +
      list(_NOT_AGAIN))
  return options


def _copy(options: Any) -> Any:
  """A copy of CompileOptions `options`."""
  return type(options).ParseFromString(options.SerializeAsString())


def _hlo_module(hlo_proto: bytes) -> Any:
  """The HloModuleProto of a dumped HloProto."""
  try:
    dumped = protos.msg("xla.HloProto").FromString(hlo_proto)
  except Exception as e:  # pylint: disable=broad-except
    raise NotRewritten(f"the dumped module is not an HloProto: {e}") from None
  if not dumped.HasField("hlo_module"):
    raise NotRewritten("the dumped HloProto holds no module")
  return dumped.hlo_module


def _check_device_orders(module: Any) -> None:
  """Raises NotRewritten if a collective's groups are axes of a mesh whose
  devices are not in iota order (a [2, 4] mesh's "model" axis over a
  (data, model) device grid, say): jaxlib 0.10.2's HLO-to-StableHLO
  translation keeps such a mesh's axes but drops its device order, so the
  program compiled from the translation would combine other devices'
  values: other sums, other gathers, silently. Such a program keeps gloo's
  order instead."""
  for computation in module.computations:
    for instruction in computation.instructions:
      if not instruction.HasField("mesh_axes_replica_group_list"):
        continue
      mesh = instruction.mesh_axes_replica_group_list.mesh
      perm = list(mesh.iota_transform.transpose_perm)
      ids = list(mesh.device_ids)
      if perm != sorted(perm) or ids != list(range(len(ids))):
        raise NotRewritten(
            f"{instruction.opcode} {instruction.name!r} groups devices of "
            f"a mesh not in iota order, which the StableHLO translation "
            f"loses")


def _reductions(op: Any) -> list[Any]:
  found = []
  for region in op.regions:
    for block in region.blocks:
      for inner in block.operations:
        found.extend(_reductions(inner.operation))
        if inner.operation.name in _REDUCTIONS:
          found.append(inner.operation)
  return found


def _meshes(module: ir.Module) -> dict[str, dict[str, int]]:
  """sdy mesh name -> {axis: size}, in axis order (meshes name the replica
  groups of collectives the partitioner writes in mesh-axes form). Meshes
  with explicit device ids are left out (their groups are not read here)."""
  meshes = {}
  for op in module.body.operations:
    if op.operation.name == "sdy.mesh":
      mesh = str(op.operation.attributes["mesh"])
      if "device_ids" in mesh:
        continue
      name = ir.StringAttr(op.operation.attributes["sym_name"]).value
      meshes[name] = {a: int(n) for a, n in re.findall(
          r'"([^"]+)"\s*=\s*(\d+)', mesh)}
  return meshes


def _groups(attr: ir.Attribute, meshes: dict[str, dict[str, int]]
            ) -> np.ndarray | None:
  """[groups, size] participant ids, in rank order; None if not read."""
  if isinstance(attr, ir.DenseIntElementsAttr):
    shape = attr.type.shape
    if len(shape) != 2:
      return None
    return np.array([int(v) for v in attr], np.int64).reshape(shape)
  text = str(attr)
  match = re.match(r"#stablehlo\.replica_group_mesh_axes<mesh = @([\w.$-]+), "
                   r"axes = \[(.*)\]>$", text)
  if not match or "sub_axis" in text or match.group(1) not in meshes:
    return None
  mesh = meshes[match.group(1)]
  axes = re.findall(r'name = "([^"]+)"', match.group(2))
  names = list(mesh)
  # Ids are the mesh's row-major positions; a group varies `axes` (its
  # first axis slowest) with the other axes fixed.
  ids = np.arange(int(np.prod(list(mesh.values())))).reshape(
      [mesh[a] for a in names])
  order = [names.index(a) for a in names if a not in axes]
  order += [names.index(a) for a in axes]
  size = int(np.prod([mesh[a] for a in axes]))
  return ids.transpose(order).reshape(-1, size)


def _combine(op: Any) -> Any:
  """The order-dependent elementwise op the collective combines with."""
  body = list(op.regions[0].blocks[0].operations)
  if len(body) != 2 or body[0].operation.name not in _COMBINES:
    return None
  args = list(op.regions[0].blocks[0].arguments)
  if list(body[0].operation.operands) != args:
    return None
  return _COMBINES[body[0].operation.name]


def _rewrite(op: Any, meshes: dict[str, dict[str, int]]) -> bool:
  """Replaces `op` (an all-reduce or reduce-scatter) by an all-to-all and
  a combine in rank order (see the module docstring); False (and `op`
  untouched) where that is not needed or not understood."""
  combine = _combine(op)
  groups = _groups(op.attributes["replica_groups"], meshes)
  types = [ir.RankedTensorType(v.type) for v in op.operands]
  if (combine is None or groups is None or groups.shape[1] < 2 or
      not any(_inexact(t.element_type) for t in types) or
      any(0 in t.shape for t in types)):
    return False
  channel = {k: op.attributes[k] for k in ("channel_handle",)
             if k in op.attributes}
  dense = ir.DenseIntElementsAttr.get(np.ascontiguousarray(groups))
  with ir.InsertionPoint(op), op.location:
    if op.name == "stablehlo.reduce_scatter":
      dim = ir.IntegerAttr(op.attributes["scatter_dimension"]).value
      results = [_exchange_combine(op.operands[0], dim, dense, channel,
                                   combine)]
    else:
      # One exchange and one gather for all operands of a type: the
      # partitioner combines a step's gradients into one all-reduce, and
      # every round across islands costs a gloo latency.
      by_type: dict[str, list[int]] = {}
      for i, t in enumerate(types):
        by_type.setdefault(str(t.element_type), []).append(i)
      results = [None] * len(types)
      for same in by_type.values():
        for i, r in zip(same, _all_reduce([op.operands[i] for i in same],
                                          [types[i] for i in same],
                                          dense, channel, combine)):
          results[i] = r
  for old, new in zip(op.results, results):
    old.replace_all_uses_with(new)
  op.erase()
  return True


def _all_reduce(values: list[Any], types: list[ir.RankedTensorType],
                groups: Any, channel: dict[str, Any], combine: Any
                ) -> list[Any]:
  """All-reduces `values` (of one element type) together: participant r
  combines, in rank order, everyone's r-th chunk of their flattened
  concatenation, and the combined chunks are gathered (two rounds, as many
  bytes as a ring all-reduce moves; the results come out of a collective,
  unfused, as the all-reduce's did: see the module docstring)."""
  n = ir.DenseIntElementsAttr(groups).type.shape[1]
  sizes = [int(np.prod(t.shape)) for t in types]
  size = sum(sizes)
  flat = [hlo.ReshapeOp(_tensor([k], t), v).result
          for v, t, k in zip(values, types, sizes)]
  gather = {"all_gather_dim": _i64(0), "replica_groups": groups, **channel}
  if channel:  # ids are partitions, as the all-to-all's (one replica)
    gather["use_global_device_ids"] = ir.UnitAttr.get()
  chunk = -(-size // n)
  if chunk * n != size:  # pad with copies of an element: dropped at the end
    first = hlo.SliceOp(flat[0], _i64s([0]), _i64s([1]), _i64s([1])).result
    flat.append(hlo.BroadcastInDimOp(_tensor([chunk * n - size], types[0]),
                                     first, _i64s([0])).result)
  joined = (hlo.ConcatenateOp(flat, 0).result if len(flat) > 1 else flat[0])
  mine = _exchange_combine(joined, 0, groups, channel, combine)
  whole = ir.Operation.create(
      "stablehlo.all_gather", results=[_tensor([chunk * n], types[0])],
      operands=[mine], attributes=gather).result
  results, start = [], 0
  for t, k in zip(types, sizes):
    part = whole
    if (start, k) != (0, chunk * n):
      part = hlo.SliceOp(whole, _i64s([start]), _i64s([start + k]),
                         _i64s([1])).result
    results.append(hlo.ReshapeOp(t, part).result)
    start += k
  return results


def _exchange_combine(value: Any, dim: int, groups: Any,
                      channel: dict[str, Any], combine: Any) -> Any:
  """Splits `value` into n blocks along `dim`, sends block j to the j-th
  participant, and combines the n blocks it receives in rank order: a
  reduce-scatter whose sums add one by one, as XLA's in-process one does."""
  t = ir.RankedTensorType(value.type)
  n = ir.DenseIntElementsAttr(groups).type.shape[1]
  attrs = {"split_dimension": _i64(dim), "concat_dimension": _i64(dim),
           "split_count": _i64(n), "replica_groups": groups, **channel}
  received = ir.Operation.create("stablehlo.all_to_all", results=[t],
                                 operands=[value], attributes=attrs).result
  return _combine_blocks(received, dim, n, combine)


def _combine_blocks(value: Any, dim: int, n: int, combine: Any) -> Any:
  """combine(...combine(b0, b1)..., b(n-1)) over the n blocks of `value`
  along `dim`."""
  t = ir.RankedTensorType(value.type)
  block = list(t.shape)
  block[dim] //= n
  out = _tensor(block, t)
  # XLA's in-process reduction adds bfloat16 in float32, rounding once.
  wide = (ir.RankedTensorType.get(block, ir.F32Type.get())
          if isinstance(t.element_type, ir.BF16Type) else out)
  total = None
  for j in range(n):
    start = [j * b if d == dim else 0 for d, b in enumerate(block)]
    limit = [a + b for a, b in zip(start, block)]
    part = hlo.SliceOp(value, _i64s(start), _i64s(limit),
                       _i64s([1] * len(block))).result
    if wide is not out:
      part = hlo.ConvertOp(wide, part).result
    total = part if total is None else combine(total, part).result
  return total if wide is out else hlo.ConvertOp(out, total).result


def _tensor(shape: list[int], like: ir.RankedTensorType
            ) -> ir.RankedTensorType:
  return ir.RankedTensorType.get(shape, like.element_type)


def _i64(value: int) -> ir.IntegerAttr:
  return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)


def _inexact(element_type: Any) -> bool:
  """Types whose sums depend on the order, and whose in-process order is
  known (measured: f16/f32/f64/complex add one by one, bf16 in f32)."""
  return isinstance(element_type, (ir.F16Type, ir.BF16Type, ir.F32Type,
                                   ir.F64Type, ir.ComplexType))


def _i64s(values: list[int]) -> ir.DenseI64ArrayAttr:
  return ir.DenseI64ArrayAttr.get(values)


def _mark_manual(module: ir.Module, aliases: dict[int, int]) -> None:
  """Every parameter and result of @main {manual}: the program is per
  device already; parameters in `aliases` reused for their result."""
  for name in ("mhlo.spmd_output_sharding", "mhlo.spmd_parameters_shardings"):
    if name in module.operation.attributes:
      del module.operation.attributes[name]
  manual = ir.StringAttr.get("{manual}")
  for op in module.body.operations:
    if (op.operation.name != "func.func" or
        ir.StringAttr(op.operation.attributes["sym_name"]).value != "main"):
      continue
    ftype = ir.FunctionType(
        ir.TypeAttr(op.operation.attributes["function_type"]).value)
    for key, count in (("arg_attrs", len(ftype.inputs)),
                       ("res_attrs", len(ftype.results))):
      old = (list(ir.ArrayAttr(op.operation.attributes[key]))
             if key in op.operation.attributes else [None] * count)
      new = []
      for i, attrs in enumerate(old):
        entries = ({a.name: a.attr for a in ir.DictAttr(attrs)}
                   if attrs is not None else {})
        entries["mhlo.sharding"] = manual
        if key == "arg_attrs" and i in aliases:
          entries.pop("jax.buffer_donor", None)
          entries["tf.aliasing_output"] = ir.IntegerAttr.get(
              ir.IntegerType.get_signless(32), aliases[i])
        new.append(ir.DictAttr.get(entries))
      op.operation.attributes[key] = ir.ArrayAttr.get(new)
