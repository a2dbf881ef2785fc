"""The IFRT-proxy schema comes from the installed jaxlib."""
from jax_pathways.wire import protos


def test_schema_has_every_request_kind():
  request = protos.msg("xla.ifrt.proxy.IfrtRequest").DESCRIPTOR
  kinds = {f.name for f in request.oneofs_by_name["request"].fields}
  assert {"init_request", "compile_request",
          "loaded_executable_execute_request", "bitcast_arrays_request"} <= kinds


def test_dtype_kinds():
  kinds = protos.enum_values("xla.ifrt.DTypeProto.Kind")
  assert kinds["KIND_F32"] == 11 and kinds["KIND_BF16"] == 16
