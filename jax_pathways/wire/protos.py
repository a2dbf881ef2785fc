"""The IFRT-proxy protobuf schema, taken at run time from the installed jaxlib.

jaxlib does not ship the .proto files of its IFRT-proxy client, but its
libjax_common.so embeds every serialized FileDescriptorProto the client was
built with. Loading those into a private descriptor pool keeps the controller
exactly in step with the client that will talk to it: nothing is hand-copied,
and a jaxlib upgrade brings its own schema. Extraction takes ~0.5 s and is
cached per jaxlib build under ~/.cache/jax_pathways.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
from typing import Any

from absl import logging
from google.protobuf import descriptor_pb2
from google.protobuf import descriptor_pool
from google.protobuf import message_factory

# The files whose messages the controller reads or writes; their imports are
# added transitively.
_ROOTS = (
    "xla/python/ifrt_proxy/common/grpc_ifrt_service.proto",
    "xla/python/ifrt/sharding_serdes.proto",
    "xla/python/pjrt_ifrt/xla_sharding.proto",
    "xla/python/pjrt_ifrt/xla_compiler.proto",
    "xla/python/ifrt/ir/ifrt_ir_program.proto",
    "xla/python/ifrt/ir/ifrt_ir_compile_options.proto",
    "xla/pjrt/proto/compile_options.proto",
    "xla/service/hlo.proto",
    "tsl/profiler/protobuf/xplane.proto",  # traces written for jax.profiler
)

# Field numbers and wire types of FileDescriptorProto, used to find where one
# embedded descriptor ends.
_FILE_DESCRIPTOR_FIELDS = {1: 2, 2: 2, 3: 2, 4: 2, 5: 2, 6: 2, 7: 2, 8: 2,
                           9: 2, 10: 0, 11: 0, 12: 2, 14: 0, 15: 2}
# A descriptor starts with field 1 (its file name), e.g. b"\n\x1bxla/....proto".
_NAME_FIELD = re.compile(rb"\n([\x05-\x7f])([A-Za-z0-9_/.\-]+?\.proto)")


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


def _extract(library: bytes) -> descriptor_pb2.FileDescriptorSet:
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


def _library_path() -> str:
  import jaxlib  # pylint: disable=import-outside-toplevel
  return os.path.join(os.path.dirname(jaxlib.__file__), "libjax_common.so")


def _load_descriptor_set() -> descriptor_pb2.FileDescriptorSet:
  path = _library_path()
  st = os.stat(path)
  key = hashlib.sha256(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode())
  cache_dir = os.path.join(os.path.expanduser("~"), ".cache", "jax_pathways")
  cache = os.path.join(cache_dir, f"ifrt-descriptors-{key.hexdigest()[:16]}.pb")
  fds = descriptor_pb2.FileDescriptorSet()
  try:
    with open(cache, "rb") as f:
      fds.ParseFromString(f.read())
    return fds
  except (OSError, Exception):  # pylint: disable=broad-except
    pass
  with open(path, "rb") as f:
    fds = _extract(f.read())
  logging.info("extracted %d protobuf descriptors from %s", len(fds.file), path)
  try:
    os.makedirs(cache_dir, exist_ok=True)
    tmp = f"{cache}.{os.getpid()}"
    with open(tmp, "wb") as f:
      f.write(fds.SerializeToString())
    os.replace(tmp, cache)
  except OSError as e:
    logging.warning("could not cache descriptors at %s: %s", cache, e)
  return fds


@functools.cache
def _pool() -> descriptor_pool.DescriptorPool:
  fds = _load_descriptor_set()
  by_name = {f.name: f for f in fds.file}
  pool = descriptor_pool.DescriptorPool()
  added: set[str] = set()

  def add(name: str) -> None:
    if name in added:
      return
    if name not in by_name:
      raise RuntimeError(
          f"jaxlib's embedded schema lacks {name}; this jaxlib build is not "
          "supported by jax_pathways (it needs jaxlib==0.10.2)")
    for dep in by_name[name].dependency:
      add(dep)
    pool.Add(by_name[name])
    added.add(name)

  for root in _ROOTS:
    add(root)
  return pool


@functools.cache
def msg(full_name: str) -> Any:
  """The message class named `full_name`, e.g. 'xla.ifrt.proxy.IfrtRequest'."""
  return message_factory.GetMessageClass(
      _pool().FindMessageTypeByName(full_name))


def enum_values(full_name: str) -> dict[str, int]:
  return {v.name: v.number
          for v in _pool().FindEnumTypeByName(full_name).values}
