"""The IFRT-proxy schema comes from the installed jaxlib."""
from google.protobuf import descriptor_pool
from google.protobuf import message_factory
from google.protobuf import unknown_fields
import pytest

from jax_pathways.wire import descriptors
from jax_pathways.wire import protos


def test_schema_has_every_request_kind():
  request = protos.msg("xla.ifrt.proxy.IfrtRequest").DESCRIPTOR
  kinds = {f.name for f in request.oneofs_by_name["request"].fields}
  assert {"init_request", "compile_request",
          "loaded_executable_execute_request", "bitcast_arrays_request"} <= kinds


def test_dtype_kinds():
  kinds = protos.enum_values("xla.ifrt.DTypeProto.Kind")
  assert kinds["KIND_F32"] == 11 and kinds["KIND_BF16"] == 16


def _cxx_schema():
  with open(descriptors.library_path(), "rb") as f:
    return descriptors.subset(descriptors.extract(f.read()),
                              descriptors.CXX_MESSAGES)


def test_the_cxx_schema_reads_what_python_writes():
  """The part of jaxlib's schema C++ is generated from (setup.py) parses a
  request Python builds with the whole schema: the fields C++ uses keep
  their values, the rest are unknown fields, not lost or misread."""
  pool = descriptor_pool.DescriptorPool()
  for f in _cxx_schema().file:
    pool.Add(f)
  narrow = message_factory.GetMessageClass(
      pool.FindMessageTypeByName("xla.ifrt.proxy.IfrtRequest"))
  full = protos.msg("xla.ifrt.proxy.IfrtRequest")()
  full.request_metadata.op_id = 7
  body = full.make_array_from_host_buffer_request
  body.host_buffer_handle, body.array_handle = 3, 4
  body.shape.dims.extend([2, 8])
  read = narrow.FromString(full.SerializeToString())
  assert read.request_metadata.op_id == 7
  made = read.make_array_from_host_buffer_request
  assert (made.host_buffer_handle, made.array_handle) == (3, 4)
  assert len(unknown_fields.UnknownFieldSet(made)) == 1  # the shape: not C++'s
  # Another kind of request is all unknown to C++ (it goes to Python).
  other = protos.msg("xla.ifrt.proxy.IfrtRequest")()
  other.compile_request.SetInParent()
  read = narrow.FromString(other.SerializeToString())
  assert read.WhichOneof("request") is None
  assert len(unknown_fields.UnknownFieldSet(read)) == 1


def test_a_field_missing_from_jaxlib_s_schema_stops_the_build():
  with open(descriptors.library_path(), "rb") as f:
    fds = descriptors.extract(f.read())
  with pytest.raises(ValueError, match="has no field"):
    descriptors.subset(fds, {"xla.ifrt.proxy.RequestMetadata": ("op_idd",)})
  with pytest.raises(ValueError, match="has no type"):
    descriptors.subset(fds, {"xla.ifrt.proxy.NoSuchRequest": None})
