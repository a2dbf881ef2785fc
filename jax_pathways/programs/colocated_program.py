"""CustomCallProgram: a `jax.experimental.colocated_python` function, read as hostile input.

jaxlib's colocated_python compiles an `xla::ifrt::CustomCallProgram` whose
type is `jax_colocated_python_v0.0.1`: the cloudpickled tuple (function,
input treedef and specs, output treedef and specs, devices), the devices it
runs beside (the client's ids) and the specs of its input and output arrays.
The controller reads only the proto: the pickle is opaque bytes that only a
colocated process (colocated/executor.py) unpickles, beside each island.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from jax_pathways import dtypes, validation
from jax_pathways.programs import sharding as sharding_lib
from jax_pathways.programs.sharding import Sharding
from jax_pathways.status import brief, invalid_argument, unimplemented
from jax_pathways.wire import protos

CUSTOM_CALL_PROGRAM = "xla::ifrt::CustomCallProgram"
CUSTOM_CALL_COMPILE_OPTIONS = "xla::ifrt::CustomCallCompileOptions"
COLOCATED_PYTHON = "jax_colocated_python_v0.0.1"
# The function and what it closes over; orbax's closures carry restore
# arguments, not arrays.
MAX_PICKLE_BYTES = 64 << 20
MAX_ARRAYS = 1 << 16


@dataclasses.dataclass(frozen=True)
class ArraySpec:
  shape: tuple[int, ...]
  dtype: str  # a numpy dtype name, or dtypes.STRING
  sharding: Sharding  # the client's device ids


@dataclasses.dataclass(frozen=True)
class ColocatedProgram:
  name: str
  pickled: bytes  # cloudpickled by the client; never read here
  key: str  # names the function to the colocated processes
  devices: tuple[int, ...]  # the client's ids
  inputs: tuple[ArraySpec, ...]
  outputs: tuple[ArraySpec, ...]


def parse(program: Any, compile_options: Any) -> ColocatedProgram:
  """The colocated function a CustomCallProgram (an xla.ifrt.Serialized)
  carries."""
  if compile_options.type_name != CUSTOM_CALL_COMPILE_OPTIONS:
    raise invalid_argument(
        f"a CustomCallProgram takes {CUSTOM_CALL_COMPILE_OPTIONS}, not "
        f"{compile_options.type_name!r}")
  if len(program.data) > MAX_PICKLE_BYTES + (1 << 20):
    raise invalid_argument(
        f"CustomCallProgram of {len(program.data)} bytes; at most "
        f"{MAX_PICKLE_BYTES} bytes of function are read")
  try:
    p = protos.msg("xla.ifrt.CustomCallProgramProto").FromString(program.data)
  except Exception:  # pylint: disable=broad-except
    raise invalid_argument("CustomCallProgram is not a "
                           "CustomCallProgramProto") from None
  if p.type != COLOCATED_PYTHON:
    raise unimplemented(
        f"CustomCallProgram of type {brief(p.type)} is not served: "
        f"jax_pathways serves {COLOCATED_PYTHON} (jax.experimental."
        "colocated_python)")
  if not p.serialized_program_text:
    raise invalid_argument("colocated_python program carries no function")
  if len(p.input_specs) > MAX_ARRAYS or len(p.output_specs) > MAX_ARRAYS:
    raise invalid_argument(f"colocated_python program of more than "
                           f"{MAX_ARRAYS} arrays")
  devices = tuple(p.devices.device_ids)
  if not devices or len(set(devices)) != len(devices):
    raise invalid_argument(f"colocated_python devices {brief(list(devices))}"
                           " must be distinct and at least one")
  inputs = tuple(_spec(s, f"input {i}", devices)
                 for i, s in enumerate(p.input_specs))
  outputs = tuple(_spec(s, f"output {i}", devices)
                  for i, s in enumerate(p.output_specs))
  # The same function, specialized alike, is the same key: a colocated
  # process unpickles it once.
  key = hashlib.sha256(p.serialized_program_text).hexdigest()[:32]
  return ColocatedProgram(p.name[:256], p.serialized_program_text, key,
                          devices, inputs, outputs)


def _spec(proto: Any, what: str, devices: tuple[int, ...]) -> ArraySpec:
  dtype = dtypes.name_of(proto.dtype, strings=True)
  shape = validation.check_shape(proto.shape.dims, dtypes.itemsize(dtype),
                                 f"colocated_python {what}")
  sharding = sharding_lib.from_proto(proto.sharding)
  sharding.check(len(shape), what)
  if not set(sharding.devices) <= set(devices):
    raise invalid_argument(
        f"colocated_python {what} is on devices {list(sharding.devices)}, "
        f"outside the program's {list(devices)}")
  return ArraySpec(shape, dtype, sharding)
