"""Frames a hostile client sends: random and mutated messages for every
gRPC method the controller serves, built from jaxlib's own schema.

A Fuzzer is seeded; every frame it makes is reproducible from (seed, index).
"""
from __future__ import annotations

import base64
import json
import random
from typing import Any, Callable, Iterator

from google.protobuf import descriptor
from jaxlib.mlir.dialects import stablehlo

from jax_pathways.wire import protos

SERVICE = "/xla.ifrt.proxy.GrpcIfrtService/"
SESSION = SERVICE + "IfrtSession"
SESSION_METADATA = "ifrt-proxy-grpc-ifrt-session-metadata-bin"
STORE_METADATA = "ifrt-proxy-grpc-host-buffer-store-metadata-bin"
TOKEN_KEY = "jax_pathways_token"

# Numbers that break careless code: zero, signs, powers of two at type
# edges, sizes that overflow when multiplied.
_INTS = [0, 1, 2, 3, 4, 7, 8, 64, 255, 1 << 16, (1 << 31) - 1, 1 << 31,
         (1 << 32) - 1, 1 << 40, 1 << 48, (1 << 62), (1 << 63) - 1]
_FD = descriptor.FieldDescriptor


# Custom call targets a hostile program names: ones that would follow a
# pointer or call into the client, ones no island runs, real kernels.
_TARGETS = ["InspectSharding", "CustomSPMDPartitioning",
            "xla_ffi_python_cpu_callback", "xla_python_cpu_callback",
            "xla_ffi_partitioned_python_cpu_callback",
            "jax_pathways.CustomSPMDPartitioning", "lapack_sgetrf_ffi",
            "Sharding", "evil", ""]


def _main(body: str, attributes: str = "") -> str:
  return f"""module @m {attributes} {{
    func.func public @main(%arg0: tensor<8xf32>) -> tensor<8xf32> {{
      {body}
      return %arg0 : tensor<8xf32>
    }}
  }}"""


def nested(depth: int) -> str:
  """MLIR of `depth` stablehlo.case regions, each inside the last."""
  lines = []
  for i in range(depth, 0, -1):
    lines.append(f"%p{i} = stablehlo.constant dense<0> : tensor<i32>")
    lines.append(f'%r{i} = "stablehlo.case"(%p{i}) ({{')
  lines.append("%v = stablehlo.constant dense<1.0> : tensor<f32>")
  lines.append("stablehlo.return %v : tensor<f32>")
  for i in range(1, depth + 1):
    lines.append("}) : (tensor<i32>) -> tensor<f32>")
    if i < depth:
      lines.append(f"stablehlo.return %r{i} : tensor<f32>")
  return "\n".join(lines)


def _artifact(text: str) -> bytes:
  try:
    return stablehlo.serialize_portable_artifact_str(
        text, stablehlo.get_current_version())
  except Exception:  # pylint: disable=broad-except
    return text.encode()  # what does not serialize goes as text


class Fuzzer:
  """Random IfrtRequests (each kind in turn), metadata and raw bytes."""

  def __init__(self, seed: int, handles: list[int]):
    self.rng = random.Random(seed)
    # Handles the fuzzing session really holds, so some requests reach
    # real arrays and programs rather than failing at the lookup.
    self.handles = handles
    request = protos.msg("xla.ifrt.proxy.IfrtRequest")
    oneof = request.DESCRIPTOR.oneofs_by_name["request"]
    self.kinds = sorted(f.name for f in oneof.fields)

  # ----------------------------------------------------------- values
  def _int(self, field: Any) -> int:
    r = self.rng.random()
    if r < 0.3 and self.handles:
      value = self.rng.choice(self.handles)
    elif r < 0.8:
      value = self.rng.choice(_INTS)
    else:
      value = self.rng.getrandbits(self.rng.choice([3, 8, 16, 32, 63]))
    signed = field.type in (_FD.TYPE_INT32, _FD.TYPE_INT64, _FD.TYPE_SINT32,
                            _FD.TYPE_SINT64, _FD.TYPE_SFIXED32,
                            _FD.TYPE_SFIXED64)
    if signed and self.rng.random() < 0.2:
      value = -value
    bits = 32 if field.type in (_FD.TYPE_INT32, _FD.TYPE_UINT32,
                                _FD.TYPE_SINT32, _FD.TYPE_FIXED32,
                                _FD.TYPE_SFIXED32) else 64
    if signed:
      half = 1 << (bits - 1)
      return max(-half, min(half - 1, value))
    return value % (1 << bits)

  def _bytes(self) -> bytes:
    n = self.rng.choice([0, 1, 4, 16, 64, 300])
    return bytes(self.rng.getrandbits(8) for _ in range(n))

  def fill(self, msg: Any, depth: int = 0) -> None:
    """Random values into some of `msg`'s fields, recursively."""
    for field in msg.DESCRIPTOR.fields:
      if self.rng.random() < 0.35 or (field.containing_oneof and
                                      self.rng.random() < 0.7):
        continue
      repeated = field.is_repeated
      count = self.rng.choice([0, 1, 1, 2, 3, 8]) if repeated else 1
      for _ in range(count):
        if field.type == _FD.TYPE_MESSAGE:
          if depth >= 4 or field.message_type.GetOptions().map_entry:
            break
          sub = (getattr(msg, field.name).add() if repeated else
                 getattr(msg, field.name))
          sub.SetInParent()
          self.fill(sub, depth + 1)
          continue
        value = self._scalar(field)
        if repeated:
          getattr(msg, field.name).append(value)
        else:
          setattr(msg, field.name, value)

  def _scalar(self, field: Any) -> Any:
    if field.type == _FD.TYPE_BOOL:
      return self.rng.random() < 0.5
    if field.type in (_FD.TYPE_FLOAT, _FD.TYPE_DOUBLE):
      return self.rng.choice([0.0, -1.0, 1e300, float("nan"), 0.5])
    if field.type == _FD.TYPE_STRING:
      return self.rng.choice(["", "x", "cpu", "device", "\u00e9" * 40,
                              "xla::ifrt::XlaProgram",
                              "xla::ifrt::IfrtIRProgram"])
    if field.type == _FD.TYPE_BYTES:
      return self._bytes()
    if field.type == _FD.TYPE_ENUM:
      values = [v.number for v in field.enum_type.values]
      return self.rng.choice(values + [max(values) + 1])
    return self._int(field)

  # --------------------------------------------------------- programs
  def program(self) -> bytes:
    """A program meant to hurt: custom calls with forged configs and
    attributes, huge values, deep nesting, unknown dialects, or a real
    program's bytes mutated."""
    rng = self.rng
    which = rng.randrange(6)
    if which == 0:  # a custom call, forged
      target = rng.choice(_TARGETS)
      config = "".join(f"\\{b:02X}" for b in self._bytes()[:32])
      extra = rng.choice(["", ", mhlo.backend_config = {index = %d : ui64}"
                          % rng.choice(_INTS[:12]),
                          ", api_version = 4 : i32",
                          ", called_computations = [@main]"])
      attrs = rng.choice(["", 'attributes {jax_pathways.host_callbacks = '
                          f'"{rng.choice(["1:1", "7:3", "x", "0:0"])}"}}'])
      body = (f'stablehlo.custom_call @{target}(%arg0) {{backend_config = '
              f'"{config}", has_side_effect = true{extra}}} : '
              "(tensor<8xf32>) -> ()")
      return _artifact(_main(body, attrs))
    if which == 1:  # a value far larger than any island
      dims = "x".join(str(rng.choice([1 << 20, 1 << 31, 10**6, 7]))
                      for _ in range(rng.randrange(1, 4)))
      return _artifact(_main(f"%c = stablehlo.constant dense<1.0> : "
                             f"tensor<{dims}xf32>"))
    if which == 2:  # nested regions (deeper ones: programs/reader.py)
      return _artifact(_main(nested(rng.randrange(1, 400))))
    if which == 3:  # an unknown dialect
      return f'module {{ "evil.op{rng.randrange(9)}"() : () -> () }}'.encode()
    real = _artifact(_main(""))
    return self.mutate(real, rate=1.0)

  def plugin_program(self) -> bytes:
    """A persistence request meant to hurt (storage/requests.py): paths
    out of any root, huge or negative shapes, forged shardings and device
    ids, wrong kinds, bad JSON, deep nesting."""
    rng = self.rng

    def b64(text: str) -> str:
      return base64.b64encode(text.encode()).decode()

    entry = {
        "b64_location": b64(rng.choice(["/tmp/fuzz", "relative", "/",
                                        "gs://bucket/x", "/a/../../etc"])),
        "b64_name": b64(rng.choice(["w", "../../etc/passwd", "/etc/shadow",
                                    "a\0b", "", "x" * 5000])),
        "b64_hlo_sharding_string": base64.b64encode(
            self._bytes()).decode(),
        "shape": [rng.choice(_INTS + [-1]) for _ in range(rng.randrange(4))],
        "devices": {"device_ids": [rng.choice(_INTS[:10] + [-3, 1 << 40])
                                   for _ in range(rng.randrange(9))]},
        "timeout": {"seconds": rng.choice([0, 1, -1, 1e300]), "nanos": 5}}
    if rng.random() < 0.5:
      entry["shape"] = {"xla_primitive_type_str": rng.choice(
          ["F32", "BF16", "S4", "F99", 7]), "dimensions": entry["shape"]}
    kind = rng.choice(["persistenceWriteRequest", "persistenceReadRequest",
                       "bulk_persistence_write_request",
                       "bulk_persistence_read_request"])
    body: Any = entry
    if kind.startswith("bulk"):
      field = "write_requests" if "write" in kind else "read_requests"
      body = {field: [entry] * rng.randrange(0, 4)}
    text = json.dumps({kind: body})
    which = rng.randrange(4)
    if which == 0:
      text = "[" * rng.randrange(1, 200_000)  # nested past any limit
    elif which == 1:
      return self.mutate(text.encode(), rate=1.0)
    return b"__serialized_plugin_program " + text.encode()

  def colocated_program(self) -> bytes:
    """A colocated_python program meant to hurt
    (programs/colocated_program.py): other types, a pickle that is no
    pickle or runs code, huge or negative shapes, string and unknown
    dtypes, devices repeated or out of any slice, forged shardings."""
    rng = self.rng
    p = protos.msg("xla.ifrt.CustomCallProgramProto")()
    p.type = rng.choice(["jax_colocated_python_v0.0.1"] * 4 +
                        ["", "evil", "jax_colocated_python_v9"])
    p.name = rng.choice(["f", "", "x" * 10_000])
    p.serialized_program_text = rng.choice([
        b"", self._bytes(), b"\x80\x04cos\nsystem\n(S'true'\ntR.",
        b"\x80" * rng.randrange(1, 1 << 16)])
    p.devices.device_ids.extend(rng.choice(_INTS[:10] + [-3, (1 << 31) - 1])
                                for _ in range(rng.randrange(4)))
    for specs in (p.input_specs, p.output_specs):
      for _ in range(rng.randrange(3)):
        spec = specs.add()
        spec.dtype.kind = rng.choice([11, 99, 0, 12345])  # f32, string
        spec.shape.dims.extend(rng.choice(_INTS + [-1])
                               for _ in range(rng.randrange(4)))
        self.fill(spec.sharding)
    data = p.SerializeToString()
    return self.mutate(data, rate=1.0) if rng.random() < 0.2 else data

  # ----------------------------------------------------------- frames
  def request(self, op_id: int) -> tuple[bytes, bool]:
    """One IfrtRequest of a random kind, and whether it was mutated (then
    it may not parse, or carry another op_id). Compile requests carry a
    hostile program (program()) more often than random bytes."""
    req = protos.msg("xla.ifrt.proxy.IfrtRequest")()
    req.request_metadata.op_id = op_id
    kind = self.rng.choice(self.kinds)
    body = getattr(req, kind)
    body.SetInParent()
    self.fill(body)
    if kind == "compile_request":
      which = self.rng.random()
      if which < 0.6:
        body.program.type_name = "xla::ifrt::XlaProgram"
        body.program.data = self.program()
      elif which < 0.75:
        body.program.type_name = "xla::ifrt::PluginProgram"
        body.program.data = self.plugin_program()
        body.compile_options.type_name = "xla::ifrt::PluginCompileOptions"
      elif which < 0.9:
        body.program.type_name = "xla::ifrt::CustomCallProgram"
        body.program.data = self.colocated_program()
        body.compile_options.type_name = (
            "xla::ifrt::CustomCallCompileOptions")
    data = req.SerializeToString()
    # Rarely: an unparsable request ends the session, and the rest of its
    # frames would reach nothing.
    mutated = self.mutate(data, rate=0.01)
    return mutated, mutated != data

  def mutate(self, data: bytes, rate: float = 0.1) -> bytes:
    """Flips, cuts or splices bytes in a fraction `rate` of frames."""
    if not data or self.rng.random() > rate:
      return data
    data = bytearray(data)
    for _ in range(self.rng.randint(1, 4)):
      op = self.rng.randrange(4)
      i = self.rng.randrange(len(data)) if data else 0
      if op == 0 and data:
        data[i] ^= 1 << self.rng.randrange(8)
      elif op == 1:
        del data[i:]
      elif op == 2:
        data[i:i] = self._bytes()
      elif data:
        data[i] = self.rng.choice([0, 0xff, 0x80, 0x7f])
    return bytes(data)

  def metadata(self, token: str) -> bytes:
    """Session metadata: right version and token, or not."""
    meta = protos.msg("xla.ifrt.proxy.GrpcIfrtSessionMetadata")()
    if self.rng.random() < 0.3:
      self.fill(meta)
    meta.version.protocol_version = self.rng.choice([25, 25, 25, 16, 0, 99])
    if self.rng.random() < 0.8:
      meta.initialization_data.attributes[TOKEN_KEY].string_value = (
          token.encode())
    return self.mutate(meta.SerializeToString(), 0.2)

  def message(self, name: str) -> bytes:
    msg = protos.msg(name)()
    self.fill(msg)
    return self.mutate(msg.SerializeToString(), 0.3)

  def unary_calls(self, token: str, session_id: int
                  ) -> Iterator[tuple[str, Callable[[Any], Any]]]:
    """(what, call(channel)) for the non-session methods, endlessly."""
    rng = self.rng
    while True:
      which = rng.randrange(7)
      if which == 0:
        data = self.message("xla.ifrt.proxy.GrpcGetVersionRequest")
        yield "GetVersion", lambda ch, d=data: ch.unary_unary(
            SERVICE + "GetVersion")(d, timeout=10)
      elif which == 1:
        meta = protos.msg("xla.ifrt.proxy.GrpcHostBufferStoreMetadata")(
            session_id=rng.choice([session_id, 0, 1, rng.getrandbits(62)]),
            handle=rng.choice(_INTS),
            buffer_size=rng.choice([0, 1, 3, 1 << 20, 1 << 44]))
        chunks = [self.message("xla.ifrt.proxy.GrpcHostBufferStoreRequest")
                  for _ in range(rng.randrange(3))]
        md = self.mutate(meta.SerializeToString(), 0.3)
        yield "HostBufferStore", lambda ch, c=chunks, m=md: ch.stream_unary(
            SERVICE + "HostBufferStore")(iter(c), timeout=10,
                                         metadata=[(STORE_METADATA, m)])
      elif which == 2:
        data = self.message("xla.ifrt.proxy.GrpcHostBufferLookupRequest")
        yield "HostBufferLookup", lambda ch, d=data: list(ch.unary_stream(
            SERVICE + "HostBufferLookup")(d, timeout=10))
      elif which == 3:
        data = self.message("xla.ifrt.proxy.GrpcHostBufferDeleteRequest")
        yield "HostBufferDelete", lambda ch, d=data: ch.unary_unary(
            SERVICE + "HostBufferDelete")(d, timeout=10)
      elif which == 4:
        method = rng.choice(["Status", "Trace", "CheckSlice", "Cancel",
                             "Nope"])
        data = self._bytes()
        md = [("jax-pathways-token", rng.choice([token, "", "guess"]))]
        yield f"Admin/{method}", lambda ch, m=method, d=data, md=md: (
            ch.unary_unary(f"/jax_pathways.Admin/{m}")(d, timeout=10,
                                                       metadata=md))
      elif which == 5:  # a callbacks stream, replying garbage
        frames = [self._bytes() for _ in range(rng.randrange(4))]
        md = [("jax-pathways-token", rng.choice([token, "", "guess"])),
              ("jax-pathways-callbacks", rng.choice(
                  ["", "x" * 100, f"fuzz{rng.getrandbits(32)}"]))]
        yield "Callbacks/Serve", lambda ch, f=frames, md=md: list(
            ch.stream_stream("/jax_pathways.Callbacks/Serve")(
                iter(f), timeout=10, metadata=md))
      else:
        method = rng.choice([SERVICE + "Nope", "/other.Service/Call",
                             SERVICE + "HostBufferReadFromDisk"])
        data = self._bytes()
        yield method, lambda ch, m=method, d=data: ch.unary_unary(m)(
            d, timeout=10)
