"""colocated_python programs as jaxlib sends them, and hostile ones: the
controller reads the proto only, never the pickle."""
from __future__ import annotations

import types

import pytest

from jax_pathways import dtypes
from jax_pathways.programs import colocated_program
from jax_pathways.programs import sharding as sharding_lib
from jax_pathways.programs.sharding import Sharding
from jax_pathways.status import Code, StatusError
from jax_pathways.wire import protos

OPTIONS = types.SimpleNamespace(
    type_name=colocated_program.CUSTOM_CALL_COMPILE_OPTIONS)


def _program(**changes) -> types.SimpleNamespace:
  p = protos.msg("xla.ifrt.CustomCallProgramProto")()
  p.type = changes.get("type", colocated_program.COLOCATED_PYTHON)
  p.name = "f"
  p.serialized_program_text = changes.get("pickled", b"\x80\x05pickled")
  p.devices.device_ids.extend(changes.get("devices", [0, 1]))
  for specs, given in ((p.input_specs, changes.get("inputs")),
                       (p.output_specs, changes.get("outputs"))):
    for dtype, shape, on in given or [("float32", [4, 2], [0, 1])]:
      spec = specs.add()
      dtypes.to_proto(dtype, spec.dtype)
      spec.shape.dims.extend(shape)
      sharding_lib.to_proto(Sharding(tuple(on)), spec.sharding)
  return types.SimpleNamespace(data=p.SerializeToString())


def _refused(code: Code, match: str, options=OPTIONS, **changes) -> None:
  with pytest.raises(StatusError, match=match) as e:
    colocated_program.parse(_program(**changes), options)
  assert e.value.status.code == code


def test_a_program_is_read_and_keyed_by_its_function():
  got = colocated_program.parse(_program(outputs=[
      ("string", [], [0, 1]), ("bfloat16", [8], [1])]), OPTIONS)
  assert got.devices == (0, 1) and got.pickled == b"\x80\x05pickled"
  assert got.inputs == (colocated_program.ArraySpec(
      (4, 2), "float32", Sharding((0, 1))),)
  assert [(o.shape, o.dtype) for o in got.outputs] == [
      ((), "string"), ((8,), "bfloat16")]
  again = colocated_program.parse(_program(), OPTIONS)
  other = colocated_program.parse(_program(pickled=b"other"), OPTIONS)
  assert got.key == again.key != other.key


def test_hostile_programs_are_refused_by_name():
  _refused(Code.UNIMPLEMENTED, "CustomCallProgram of type 'evil' is not "
           "served", type="evil")
  _refused(Code.INVALID_ARGUMENT, "carries no function", pickled=b"")
  _refused(Code.INVALID_ARGUMENT, "must be distinct", devices=[1, 1])
  _refused(Code.INVALID_ARGUMENT, "must be distinct", devices=[])
  _refused(Code.INVALID_ARGUMENT, r"input 0 is on devices \[0, 5\], outside "
           r"the program's \[0, 1\]", inputs=[("float32", [4], [0, 5])])
  _refused(Code.INVALID_ARGUMENT, "larger than", inputs=[
      ("float32", [1 << 40, 1 << 40], [0, 1])])
  _refused(Code.INVALID_ARGUMENT, "negative", outputs=[
      ("float32", [-1], [0, 1])])
  _refused(Code.INVALID_ARGUMENT, "takes xla::ifrt::CustomCallCompileOptions",
           options=types.SimpleNamespace(type_name="xla::ifrt::XlaCompileOptions"))
  with pytest.raises(StatusError, match="at most"):
    colocated_program.parse(types.SimpleNamespace(data=b"x" * (66 << 20)),
                            OPTIONS)
  with pytest.raises(StatusError, match="is not a CustomCallProgramProto"):
    colocated_program.parse(types.SimpleNamespace(data=b"\xff\xff\xff"),
                            OPTIONS)
