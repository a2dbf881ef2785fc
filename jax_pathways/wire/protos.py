"""The IFRT-proxy protobuf schema, taken at run time from the installed jaxlib.

The descriptors jaxlib embeds (`descriptors`) are loaded into a private
descriptor pool: the controller reads exactly the schema of the client that
talks to it, nothing is hand-copied, and a jaxlib upgrade brings its own.
Extraction takes ~0.5 s and is cached per jaxlib build under
~/.cache/jax_pathways.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from typing import Any

from absl import logging
from google.protobuf import descriptor_pb2
from google.protobuf import descriptor_pool
from google.protobuf import message_factory

from jax_pathways.wire import descriptors

# The files whose messages the controller reads or writes; their imports are
# added transitively.
_ROOTS = (
    "xla/python/ifrt_proxy/common/grpc_ifrt_service.proto",
    "xla/python/ifrt/sharding_serdes.proto",
    "xla/python/pjrt_ifrt/xla_sharding.proto",
    "xla/python/pjrt_ifrt/xla_compiler.proto",
    "xla/python/ifrt/ir/ifrt_ir_program.proto",
    "xla/python/ifrt/ir/ifrt_ir_compile_options.proto",
    "xla/python/ifrt/custom_call_program.proto",  # colocated_python
    "xla/python/ifrt_proxy/common/array_util.proto",  # string contents
    "xla/pjrt/proto/compile_options.proto",
    "xla/service/hlo.proto",
    "tsl/profiler/protobuf/xplane.proto",  # traces written for jax.profiler
)


def _load_descriptor_set() -> descriptor_pb2.FileDescriptorSet:
  path = descriptors.library_path()
  st = os.stat(path)
  key = hashlib.sha256(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode())
  cache_dir = os.path.join(os.path.expanduser("~"), ".cache", "jax_pathways")
  cache = os.path.join(cache_dir, f"ifrt-descriptors-{key.hexdigest()[:16]}.pb")
  fds = descriptor_pb2.FileDescriptorSet()
  with contextlib.suppress(Exception):  # not cached yet, or unreadable
    with open(cache, "rb") as f:
      fds.ParseFromString(f.read())
    return fds
  with open(path, "rb") as f:
    fds = descriptors.extract(f.read())
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
  try:
    files = descriptors.in_import_order({f.name: f for f in fds.file}, _ROOTS)
  except KeyError as e:
    raise RuntimeError(
        f"jaxlib's embedded schema lacks {e.args[0]}; this jaxlib build is "
        "not supported by jax_pathways (it needs jaxlib==0.10.2)") from None
  pool = descriptor_pool.DescriptorPool()
  for f in files:
    pool.Add(f)
  return pool


@functools.cache
def msg(full_name: str) -> Any:
  """The message class named `full_name`, e.g. 'xla.ifrt.proxy.IfrtRequest'."""
  return message_factory.GetMessageClass(
      _pool().FindMessageTypeByName(full_name))


def enum_values(full_name: str) -> dict[str, int]:
  return {v.name: v.number
          for v in _pool().FindEnumTypeByName(full_name).values}
