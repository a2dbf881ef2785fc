"""Lowering: a jitted step's StableHLO, in the MPMD dialect's terms.

JAX lowers the marked step (stages.py) to ordinary StableHLO in which stages
and microbatches are calls to functions with telling names. The partitioner
wants them as MPMD ops: every stage call becomes an
`mpmd.named_computation<"stage"(t)>` holding the stage's body (t = 1 for a
backward), and every microbatch call in @main an `mpmd.call` with
`call_counter = i`, which is what lets the partitioner tell the microbatches
apart and schedule them.

JAX adds the microbatches' weight gradients up in @main, in microbatch
order, and the partitioner would put that whole sum into each stage's last
backward fragment, which then holds M-1 gradient copies and runs longer
than the others. The sum is moved into the backward fragments instead
(`_accumulate_in_backwards`): microbatch i's backward takes the running sum
and adds its own gradient to it, the same adds in the same order.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

from jax_pathways.mpmd import stages

_STAGE = re.compile(rf"^{stages.STAGE_PREFIX}(\w+?)__([{stages.FORWARD}"
                    rf"{stages.BACKWARD}{stages.PLAIN}])(?:_\d+)?$")
_MICROBATCH = re.compile(rf"^{stages.MICROBATCH_PREFIX}(\d+)__(?:_\d+)?$")


@dataclasses.dataclass
class Lowered:
  """The rewritten module and what was found in it."""
  module: Any
  stage_names: list[str]   # in order of first appearance
  microbatches: int


def to_mpmd(module: Any, clone: Any) -> Lowered:
  """Rewrites a clone of `module` (jaxlib's MLIR Module; `clone` is the
  extension's clone_mlir_module: JAX caches the original)."""
  from jaxlib.mlir import ir  # pylint: disable=import-outside-toplevel
  from jaxlib.mlir.dialects import mpmd  # pylint: disable=import-outside-toplevel
  module = clone(module)
  stage_names: list[str] = []
  counters: set[int] = set()
  with module.context, ir.Location.unknown():
    table = ir.SymbolTable(module.operation)
    functions = [op for op in module.body.operations
                 if op.operation.name == "func.func"]
    main = table["main"]
    for fn in functions:
      for call in _calls(fn):
        m = _STAGE.match(_callee(call))
        if m is None:
          continue
        name, kind = m.groups()
        if name not in stage_names:
          stage_names.append(name)
        _inline_as_named_computation(call, table[_callee(call)], name,
                                     1 if kind == stages.BACKWARD else 0,
                                     ir, mpmd)
    u32 = ir.IntegerType.get_unsigned(32)
    forward_calls = []
    for call in _calls(main):
      m = _MICROBATCH.match(_callee(call))
      if m is None:
        continue
      index = int(m.group(1))
      counters.add(index)
      new = _remade_call(call, list(call.operands),
                         {"call_counter": ir.IntegerAttr.get(u32, index)},
                         ir, mpmd)
      if not _is_backward(table[_callee(new)]):
        forward_calls.append((index, new))
    _in_counter_order(main, forward_calls)
    _accumulate_in_backwards(main, table, ir, mpmd)
    _drop_unused_functions(module, ir)
    if not module.operation.verify():
      raise RuntimeError("jax_pathways.mpmd produced an invalid module")
  return Lowered(module, stage_names, len(counters))


def _calls(fn: Any) -> list[Any]:
  return [op for op in fn.regions[0].blocks[0].operations
          if op.operation.name == "func.call"]


def _callee(call: Any) -> str:
  return str(call.attributes["callee"]).lstrip("@").strip('"')


def _is_backward(fn: Any) -> bool:
  return any(op.operation.name == "mpmd.named_computation" and
             re.search(r'"\([1-9]', str(op.attributes["origin"])) is not None
             for op in fn.regions[0].blocks[0].operations)


def _inline_as_named_computation(call: Any, callee: Any, name: str,
                                 transposed: int, ir: Any, mpmd: Any) -> None:
  """Replaces `call` with a named computation holding a copy of the body."""
  copy = callee.operation.clone(ip=ir.InsertionPoint(callee))
  body = copy.regions[0].blocks[0]
  with ir.InsertionPoint(call), call.location:
    named = mpmd.NamedComputationOp(
        [r.type for r in call.results], list(call.operands),
        mpmd.UserOriginAttr.get(name, transposed))
  block = named.region.blocks.append(*[a.type for a in body.arguments])
  ops = list(body.operations)
  ret = ops[-1]
  with ir.InsertionPoint(block), ret.location:
    new_ret = mpmd.ReturnOp(list(ret.operands))
  for op in ops[:-1]:
    op.operation.move_before(new_ret.operation)
  for old, new in zip(body.arguments, block.arguments):
    old.replace_all_uses_with(new)
  ret.operation.erase()
  _replace(call, named)
  copy.operation.erase()


def _accumulate_in_backwards(main: Any, table: Any, ir: Any,
                             mpmd: Any) -> None:
  """Folds each `add(running sum, backward i's gradient)` of @main into
  the named computation of backward i that makes the gradient, which gets
  the running sum as an extra operand. Only where nothing else reads that
  gradient: otherwise the add stays where JAX put it."""
  backwards = [op for op in main.regions[0].blocks[0].operations
               if op.operation.name == "mpmd.call" and
               _is_backward(table[_callee(op)])]
  callees = [_callee(c) for c in backwards]
  for n, call in enumerate(backwards):
    fn = table[_callee(call)]
    if callees.count(_callee(call)) != 1:
      continue  # a body shared with another call cannot change for one
    ret = list(fn.regions[0].blocks[0].operations)[-1]
    earlier = {b.operation for b in backwards[:n]}
    links: dict[int, tuple[Any, Any]] = {}  # result -> (add, running sum)
    for k, result in enumerate(call.results):
      uses = list(result.uses)
      if len(uses) != 1 or uses[0].owner.name != "stablehlo.add":
        continue
      add = uses[0].owner
      running = add.operands[1 - uses[0].operand_number]
      made = ret.operands[k]
      if (running.owner not in earlier or made.owner.name !=
          "mpmd.named_computation" or len(list(made.uses)) != 1):
        continue
      links[k] = (add, running)
    if not links:
      continue
    order = sorted(links)
    _add_into(fn, ret, order, ir, mpmd)
    new = _remade_call(call, list(call.operands) +
                       [links[k][1] for k in order], call.attributes, ir, mpmd)
    for k in order:
      add = links[k][0]
      add.result.replace_all_uses_with(new.results[k])
      add.erase()
    backwards[n] = new


def _remade_call(op: Any, operands: list[Any], attributes: Any, ir: Any,
                 mpmd: Any) -> Any:
  """An mpmd.call of `op`'s callee on `operands`, with `attributes` (but
  the callee), in `op`'s place."""
  with ir.InsertionPoint(op), op.location:
    new = mpmd.CallOp([r.type for r in op.results], operands,
                      ir.FlatSymbolRefAttr.get(_callee(op)))
  for name, value in attributes.items():
    if name != "callee":
      new.attributes[name] = value
  _replace(op, new)
  return new


def _replace(old: Any, new: Any) -> None:
  """Erases op `old`, its results' uses now `new`'s results."""
  for result, replacement in zip(old.results, new.results):
    result.replace_all_uses_with(replacement)
  old.operation.erase()


def _add_into(fn: Any, ret: Any, results: list[int], ir: Any,
              mpmd: Any) -> None:
  """Gives `fn` one argument per result in `results`, added (inside the
  named computation that makes it) to what it returns there."""
  from jaxlib.mlir.dialects import stablehlo  # pylint: disable=import-outside-toplevel
  block = fn.regions[0].blocks[0]
  sums = {k: block.add_argument(ret.operands[k].type, fn.location)
          for k in results}
  ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
  fn.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
      list(ftype.inputs) + [sums[k].type for k in results],
      list(ftype.results)))
  if "arg_attrs" in fn.attributes:
    attrs = list(ir.ArrayAttr(fn.attributes["arg_attrs"]))
    fn.attributes["arg_attrs"] = ir.ArrayAttr.get(
        attrs + [ir.DictAttr.get({}) for _ in results])
  by_computation: dict[Any, list[int]] = {}
  for k in results:
    by_computation.setdefault(ret.operands[k].owner, []).append(k)
  for named, ks in by_computation.items():
    old_block = named.regions[0].blocks[0]
    with ir.InsertionPoint(named), named.location:
      new = mpmd.NamedComputationOp(
          [r.type for r in named.results],
          list(named.operands) + [sums[k] for k in ks],
          named.attributes["origin"])
    for name, value in named.attributes.items():
      if name != "origin":
        new.attributes[name] = value
    new_block = new.region.blocks.append(
        *[a.type for a in old_block.arguments],
        *[sums[k].type for k in ks])
    for op in list(old_block.operations):
      ir.InsertionPoint(new_block).insert(op.operation.detach_from_parent())
    for old, arg in zip(old_block.arguments, new_block.arguments):
      old.replace_all_uses_with(arg)
    inner_ret = list(new_block.operations)[-1]
    extra = list(new_block.arguments)[len(old_block.arguments):]
    for k, running in zip(ks, extra):
      j = ir.OpResult(ret.operands[k]).result_number
      with ir.InsertionPoint(inner_ret), inner_ret.location:
        total = stablehlo.AddOp(running, inner_ret.operands[j])
      inner_ret.operands[j] = total.result
    _replace(named, new)


def _in_counter_order(main: Any, calls: list[tuple[int, Any]]) -> None:
  """Puts the forward microbatch calls in ascending order, after the last of
  them: the order schedules leave unconstrained (e.g. a warm-up) follows
  program order. They only move later, so their operands still dominate."""
  if len(calls) < 2:
    return
  ops = list(main.regions[0].blocks[0].operations)
  position = {op: i for i, op in enumerate(ops)}
  last = max(position[c] for _, c in calls)
  for _, call in calls:
    for result in call.results:
      for use in result.uses:
        if position[call] < position.get(use.owner, -1) <= last:
          return  # a result is used in between: keep JAX's order
  after = ops[last + 1]
  for _, call in sorted(calls, key=lambda ic: ic[0]):
    call.operation.move_before(after.operation)


def _drop_unused_functions(module: Any, ir: Any) -> None:
  while True:
    used: set[str] = set()

    def collect(op: Any) -> Any:
      if "callee" in op.attributes:
        used.add(str(op.attributes["callee"]).split("::")[0].lstrip("@")
                 .strip('"'))
      return ir.WalkResult.ADVANCE

    module.operation.walk(collect)
    dead = [op for op in module.body.operations
            if op.operation.name == "func.func" and
            ir.StringAttr(op.attributes["sym_name"]).value not in used | {"main"}]
    if not dead:
      return
    for op in dead:
      op.operation.erase()
