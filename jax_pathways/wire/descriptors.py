"""The IFRT-proxy schema as jaxlib ships it: its serialized descriptors.

jaxlib does not ship the .proto files of its IFRT-proxy client, but its
libjax_common.so embeds every serialized FileDescriptorProto the client was
built with. This module finds them; `protos` loads them for Python at run
time and setup.py hands a `subset` of them to protoc for the C++ fast path at
build time, so both languages read the one schema jaxlib was built with.

Only the protobuf library and the standard library are imported here:
setup.py loads this file by path, before jax_pathways is installed.
"""
from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterable, Mapping, Sequence

from google.protobuf import descriptor_pb2

# Field numbers and wire types of FileDescriptorProto, used to find where one
# embedded descriptor ends.
_FILE_DESCRIPTOR_FIELDS = {1: 2, 2: 2, 3: 2, 4: 2, 5: 2, 6: 2, 7: 2, 8: 2,
                           9: 2, 10: 0, 11: 0, 12: 2, 14: 0, 15: 2}
# A descriptor starts with field 1 (its file name), e.g. b"\n\x1bxla/....proto".
_NAME_FIELD = re.compile(rb"\n([\x05-\x7f])([A-Za-z0-9_/.\-]+?\.proto)")


_PROXY = "xla.ifrt.proxy."
# The requests C++ answers (csrc/controller/fast_path/), and their responses.
_FAST_REQUESTS = ("loaded_executable_execute", "check_value_ready",
                  "destruct_array", "fully_replicated_shard",
                  "disassemble_into_single_device_arrays",
                  "copy_to_host_buffer", "make_array_from_host_buffer",
                  "make_arrays_from_host_buffer_shards")
# What C++ reads and writes, for `subset`: message -> the fields it uses
# (None: all). The fast path's uploads compare the other fields' bytes, read
# as unknown fields, so their types need no C++; the host-buffer messages
# are the gRPC server's (csrc/controller/server/).
CXX_MESSAGES: dict[str, tuple[str, ...] | None] = {
    _PROXY + "IfrtRequest":
        ("request_metadata",) + tuple(f"{r}_request" for r in _FAST_REQUESTS),
    _PROXY + "IfrtResponse":
        ("response_metadata",) + tuple(f"{r}_response" for r in _FAST_REQUESTS),
    _PROXY + "RequestMetadata": ("op_id",),
    _PROXY + "ResponseMetadata": ("op_id", "status"),
    "tensorflow.StatusProto": ("code", "message"),
    "xla.ifrt.ExecuteOptionsProto": ("fill_status",),
    _PROXY + "LoadedExecutableExecuteResponse": (),
    _PROXY + "MakeArrayFromHostBufferRequest":
        ("host_buffer_handle", "array_handle"),
    _PROXY + "MakeArraysFromHostBufferShardsRequest.HostBuffer":
        ("host_buffer_handle",),
    _PROXY + "MakeArraysFromHostBufferShardsRequest."
             "MakeArraysFromHostBufferShardsSpec": ("host_buffers",),
    _PROXY + "GrpcHostBufferStoreMetadata": None,
    _PROXY + "GrpcHostBufferStoreRequest": None,
    _PROXY + "GrpcHostBufferLookupRequest": None,
    _PROXY + "GrpcHostBufferLookupResponse": None,
    _PROXY + "GrpcHostBufferDeleteRequest": None,
}


def library_path() -> str:
  """jaxlib's libjax_common.so, found without importing jaxlib."""
  spec = importlib.util.find_spec("jaxlib")
  if spec is None or not spec.submodule_search_locations:
    raise RuntimeError("jaxlib is not installed (jax_pathways needs "
                       "jaxlib==0.10.2: its schema is read from jaxlib)")
  return os.path.join(list(spec.submodule_search_locations)[0],
                      "libjax_common.so")


def _varint(buf: bytes, i: int) -> tuple[int, int]:
  shift = result = 0
  while True:
    b = buf[i]
    i += 1
    result |= (b & 0x7F) << shift
    if not b & 0x80:
      return result, i
    shift += 7
    if shift > 63:
      raise ValueError("varint too long")


def _descriptor_end(buf: bytes, start: int) -> int:
  """Walks fields from `start` while they fit FileDescriptorProto."""
  i, seen_name = start, False
  while i < len(buf):
    try:
      tag, j = _varint(buf, i)
      field, wire_type = tag >> 3, tag & 7
      if _FILE_DESCRIPTOR_FIELDS.get(field) != wire_type:
        break
      if field == 1:
        if seen_name:
          break  # the next descriptor begins here
        seen_name = True
      value, j = _varint(buf, j)
      if wire_type == 2:
        j += value
        if j > len(buf):
          break
    except (IndexError, ValueError):
      break
    i = j
  return i


def extract(library: bytes) -> descriptor_pb2.FileDescriptorSet:
  """Every FileDescriptorProto serialized in `library`, by file name."""
  found: dict[str, bytes] = {}
  for m in _NAME_FIELD.finditer(library):
    if m.group(1)[0] != len(m.group(2)):
      continue
    blob = library[m.start():_descriptor_end(library, m.start())]
    fdp = descriptor_pb2.FileDescriptorProto()
    try:
      fdp.ParseFromString(blob)
    except Exception:  # pylint: disable=broad-except
      continue  # a string that merely looks like a descriptor
    if not (fdp.package or fdp.message_type or fdp.service):
      continue
    if len(blob) > len(found.get(fdp.name, b"")):
      found[fdp.name] = blob
  fds = descriptor_pb2.FileDescriptorSet()
  for name in sorted(found):
    fds.file.add().ParseFromString(found[name])
  return fds


def subset(fds: descriptor_pb2.FileDescriptorSet,
           keep: Mapping[str, Sequence[str] | None]
           ) -> descriptor_pb2.FileDescriptorSet:
  """The part of `fds` that the messages in `keep` need, for protoc.

  `keep` maps a message's full name to the fields it keeps (None: all). Only
  those messages, the types their kept fields use (whole, unless `keep` names
  them too) and the messages enclosing them remain; a field left out is
  read as an unknown field. Services and extensions are left out.
  """
  where: dict[str, tuple[str, str | None]] = {}  # type -> (file, enclosing)
  messages: dict[str, descriptor_pb2.DescriptorProto] = {}

  def index(file: str, scope: str, types: Sequence[descriptor_pb2.DescriptorProto],
            enums: Sequence[descriptor_pb2.EnumDescriptorProto],
            outer: str | None) -> None:
    for e in enums:
      where[f"{scope}.{e.name}"] = (file, outer)
    for m in types:
      name = f"{scope}.{m.name}"
      where[name], messages[name] = (file, outer), m
      index(file, name, m.nested_type, m.enum_type, name)

  for f in fds.file:
    index(f.name, f".{f.package}" if f.package else "", f.message_type,
          f.enum_type, None)

  def kept_fields(name: str) -> list[descriptor_pb2.FieldDescriptorProto]:
    names = keep.get(name[1:])
    fields = messages[name].field
    if names is None:
      return list(fields)
    missing = set(names) - {f.name for f in fields}
    if missing:
      raise ValueError(f"{name[1:]} has no field {sorted(missing)}")
    return [f for f in fields if f.name in names]

  needed: set[str] = set()
  todo = [f".{name}" for name in keep]
  while todo:
    name = todo.pop()
    if name in needed:
      continue
    if name not in where:
      raise ValueError(f"jaxlib's schema has no type {name[1:]}")
    needed.add(name)
    outer = where[name][1]
    if outer:
      todo.append(outer)
    if name in messages:
      todo += [f.type_name for f in kept_fields(name) if f.type_name]

  def prune(scope: str, types, enums, out_types, out_enums, uses: set[str]):
    for e in enums:
      if f"{scope}.{e.name}" in needed:
        out_enums.add().CopyFrom(e)
    for m in types:
      name = f"{scope}.{m.name}"
      if name not in needed:
        continue
      out = out_types.add()
      out.CopyFrom(m)
      del out.field[:], out.nested_type[:], out.enum_type[:]
      del out.oneof_decl[:]
      fields = kept_fields(name)
      # Oneofs keep their order; those left without a field go.
      oneofs = sorted({f.oneof_index for f in fields if f.HasField("oneof_index")})
      for i in oneofs:
        out.oneof_decl.add().CopyFrom(m.oneof_decl[i])
      for f in fields:
        g = out.field.add()
        g.CopyFrom(f)
        if f.HasField("oneof_index"):
          g.oneof_index = oneofs.index(f.oneof_index)
        if f.type_name:
          uses.add(where[f.type_name][0])
      prune(name, m.nested_type, m.enum_type, out.nested_type, out.enum_type,
            uses)

  needed_files = {where[n][0] for n in needed}
  kept: dict[str, descriptor_pb2.FileDescriptorProto] = {}
  for f in fds.file:
    if f.name not in needed_files:
      continue
    g = kept[f.name] = descriptor_pb2.FileDescriptorProto()
    g.CopyFrom(f)
    del g.message_type[:], g.enum_type[:], g.service[:], g.extension[:]
    del g.dependency[:], g.public_dependency[:], g.weak_dependency[:]
    g.ClearField("source_code_info")
    uses: set[str] = set()
    scope = f".{f.package}" if f.package else ""
    prune(scope, f.message_type, f.enum_type, g.message_type, g.enum_type,
          uses)
    g.dependency.extend(d for d in f.dependency if d in uses - {f.name})
  out = descriptor_pb2.FileDescriptorSet()
  out.file.extend(in_import_order(kept, kept))
  return out


def in_import_order(files: Mapping[str, descriptor_pb2.FileDescriptorProto],
                    roots: Iterable[str]
                    ) -> list[descriptor_pb2.FileDescriptorProto]:
  """`roots` and the files they import, each after its imports. KeyError
  names an imported file missing from `files`."""
  out: dict[str, descriptor_pb2.FileDescriptorProto] = {}

  def visit(name: str) -> None:
    if name not in out:
      for dep in files[name].dependency:
        visit(dep)
      out[name] = files[name]

  for root in roots:
    visit(root)
  return list(out.values())
