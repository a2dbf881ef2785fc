"""What a worker reads of a program and of its compiled executable: @main's
signature (from the MLIR module), the metadata the controller and the
client learn (name, fingerprint, layouts, cost, memory stats, shardings),
and the parameters XLA aliased to outputs (donated)."""
from __future__ import annotations

import base64
from typing import Any

from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import hlo

from jax_pathways import dtypes
from jax_pathways.wire import protos


_MEMORY_STATS_FIELDS = (
    "generated_code_size_in_bytes", "argument_size_in_bytes",
    "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
    "host_generated_code_size_in_bytes", "host_argument_size_in_bytes",
    "host_output_size_in_bytes", "host_alias_size_in_bytes",
    "host_temp_size_in_bytes")


def _main_type(module: Any) -> Any:
  """@main's ir.FunctionType (call within the module's context)."""
  for op in module.body.operations:
    if ir.StringAttr(op.attributes["sym_name"]).value == "main":
      return ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
  raise ValueError("the program has no public function @main")


def signature(module: Any, context: Any
              ) -> tuple[list[tuple[tuple[int, ...], str]],
                         list[tuple[tuple[int, ...], str] | None], bool]:
  """Global result shapes/dtypes of @main, its parameters'
  shapes/dtypes (None where not an array of a known dtype), and whether
  it takes or returns a token."""
  with context:
    ftype = _main_type(module)
    outputs = []
    for t in ftype.results:
      if hlo.TokenType.isinstance(t):
        # JAX holds a token as bool[0] (core.get_token_aval()), in and
        # out; PJRT takes and makes such buffers for token parameters.
        outputs.append(((0,), "bool"))
        continue
      rt = ir.RankedTensorType(t)
      outputs.append((tuple(rt.shape), _mlir_dtype(rt.element_type)))
    passes_tokens = any(hlo.TokenType.isinstance(t)
                        for t in (*ftype.inputs, *ftype.results))
    return (outputs, [dtypes.tensor_type(t) for t in ftype.inputs],
            passes_tokens)


def encoded_shardings(shardings: list[Any] | None) -> list[str] | None:
  """xla.OpSharding protos, base64 (as the metadata carries them)."""
  if shardings is None:
    return None
  return [base64.b64encode(s.SerializeToString()).decode()
          for s in shardings]


def describe(executable: Any, outputs: list[tuple[tuple[int, ...], str]]
             ) -> dict[str, Any]:
  """What the controller and the client learn of a compiled program."""
  def layouts(fn):
    try:
      # pylint: disable-next=protected-access
      return [list(x._xla_layout().minor_to_major()) for x in fn()]
    except Exception as e:  # pylint: disable=broad-except
      return {"error": str(e)}

  try:
    cost = {k: float(v) for k, v in (executable.cost_analysis() or {}).items()}
  except Exception:  # pylint: disable=broad-except
    cost = {}
  stats = executable.get_compiled_memory_stats()
  return {
      "name": executable.hlo_modules()[0].name,
      "fingerprint": _fingerprint(executable),
      "outputs": [{"shape": list(s), "dtype": d} for s, d in outputs],
      "output_layouts": layouts(executable.get_output_layouts),
      "parameter_layouts": layouts(executable.get_parameter_layouts),
      "output_memory_kinds": [list(k) for k in
                              executable.get_output_memory_kinds()],
      "cost_analysis": cost,
      "hlo_text": executable.hlo_modules()[0].to_string(),
      "memory_stats": {f: getattr(stats, f) for f in _MEMORY_STATS_FIELDS},
      "code_size": executable.size_of_generated_code_in_bytes(),
  }


def _mlir_dtype(element_type: Any) -> str:
  name = dtypes.from_mlir(element_type)
  if name is None:
    raise ValueError(f"unsupported result element type {element_type}")
  return name


def aliases(executable: Any) -> list[Any]:
  """The input/output aliases XLA chose (HloInputOutputAliasProto entries).
  JAX tuples no CPU program's arguments, so a parameter is an argument."""
  module = protos.msg("xla.HloModuleProto").FromString(
      executable.hlo_modules()[0].as_serialized_hlo_module_proto())
  return list(module.input_output_alias.entries)


def donated(executable: Any) -> list[int]:
  """The parameters PJRT donates: those XLA aliased to an output. A donor
  XLA found no use for (`jax.buffer_donor` without an alias) stays alive, as
  in plain JAX."""
  return sorted({e.parameter_number for e in aliases(executable)})


def _fingerprint(executable: Any) -> str:
  fp = executable.fingerprint
  if isinstance(fp, bytes):
    return base64.b64encode(fp).decode()
  return ""
