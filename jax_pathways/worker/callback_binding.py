"""Callbacks: a program's callbacks, run in its client's process.

The controller checked the program (programs/custom_calls.py) and gave it
a route (controller/callback_router.py); the worker checks it again and binds
its callbacks before XLA sees it:

* host callbacks: the callables handed to XLA beside the program are
  stubs that send their operands to the controller over this worker's
  callbacks connection (Link) and return what the client's callable
  returned, checked against the types the program declares;
* InspectSharding: the key the client's JAX wrote is replaced by a
  pointer to a forwarder of this process, which asks the client;
* CustomSPMDPartitioning: it becomes a call of FORWARDED_PARTITIONING
  (XLA keeps the first partitioner registered under a name, JAX's, which
  would look the key up in this process), its key rewritten to name the
  route; the partitioner registered here under that name (install())
  asks the client for each answer. Answers are programs too: they are
  checked before XLA inlines them.

A callback that fails (it raised, its client went away, its results do not
fit) fails its launch. On one device the stub raises into XLA, which ends
the launch at once, as JAX does locally. On several devices the others
would wait for it in a collective (XLA:CPU then aborts the process after
40 s); there the stub returns zeros instead, every later callback of the
launch returns at once, and the launch reports the callback's failure
when it finishes (Binding.failure; worker/callback_lanes.py runs such
launches one at a time, so a failure belongs to the launch that made it).
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import socket
import threading
from typing import Any, Callable

import numpy as np

from jax_pathways import dtypes
from jax_pathways import threads
from jax_pathways.programs import custom_calls
from jax_pathways.status import Code, Status, StatusError
from jax_pathways.wire import callback_messages as msg

# How XLA words a callback's failure, which the launch of one that did not
# raise into XLA reports in the same words.
_FAILED = "CpuCallback error calling callback: "
# What CustomSPMDPartitioning becomes here, and its config:
# b"jp:<route>:<the client's key>".
FORWARDED_PARTITIONING = "jax_pathways.CustomSPMDPartitioning"
_PREFIX = b"jp:"


class CallbackError(RuntimeError):
  """A callback failed; the message is the client's (with its traceback)."""


class Link:
  """This worker's callbacks connection to the controller, made when first
  needed (and again after one broke). Thread-safe: XLA's threads call at
  once, each waiting for its own reply."""

  def __init__(self, connect: Callable[[], socket.socket]):
    """connect(): a new authenticated connection to the controller."""
    self._connect = connect
    self._lock = threading.Lock()
    self._sock: socket.socket | None = None
    self._ids = itertools.count(1)
    # Request id -> (its connection, [done, reply]).
    self._waiting: dict[int, tuple[socket.socket, list[Any]]] = {}

  def request(self, header: dict[str, Any], blobs: list[Any] = ()
              ) -> tuple[dict[str, Any], list[memoryview]]:
    """Sends a call or question and waits for its reply. The controller
    answers every request, or the connection ends and its requests fail."""
    slot: list[Any] = [threading.Event(), None]
    with self._lock:
      sock = self._open()
      request = next(self._ids)
      self._waiting[request] = (sock, slot)
      try:
        msg.write_frame(sock, msg.encode({**header, "id": request}, blobs))
      except OSError as e:
        self._waiting.pop(request, None)
        # Its reader fails the rest and closes it.
        with contextlib.suppress(OSError):
          sock.shutdown(socket.SHUT_RDWR)
        if self._sock is sock:
          self._sock = None
        raise CallbackError(f"the controller's callbacks connection broke: "
                            f"{e}") from None
    slot[0].wait()
    reply = slot[1]
    if isinstance(reply, Status):
      raise CallbackError(reply.message)
    return reply

  def _open(self) -> socket.socket:
    if self._sock is None:
      try:
        self._sock = self._connect()
      except Exception as e:  # pylint: disable=broad-except
        raise CallbackError(f"cannot reach the controller for callbacks: "
                            f"{e}") from None
      threads.start(self._read, "jp-callbacks", self._sock)
    return self._sock

  def _read(self, sock: socket.socket) -> None:
    why = "the controller closed the callbacks connection"
    try:
      while True:
        data = msg.read_frame(sock)
        if data is None:
          break
        header, blobs = msg.decode(data)
        with self._lock:
          found = self._waiting.pop(header["id"], None)
        if found is not None:
          found[1][1] = (header, blobs)
          found[1][0].set()
    except (OSError, ValueError) as e:
      why = f"the callbacks connection to the controller broke: {e}"
    with self._lock:
      if self._sock is sock:
        self._sock = None
      mine = [r for r, (s, _) in self._waiting.items() if s is sock]
      slots = [self._waiting.pop(r)[1] for r in mine]
    sock.close()
    for slot in slots:
      slot[1] = Status(Code.UNAVAILABLE, why)
      slot[0].set()


def _request(link: Link, request: dict[str, Any], blobs: list[Any]
             ) -> tuple[dict[str, Any], list[memoryview]]:
  """Link.request, raising the client's error if its reply carries one."""
  header, out = link.request(request, blobs)
  status = msg.reply_status(header)
  if not status.ok:
    raise CallbackError(status.message)
  return header, out


def ask(link: Link, route: int, what: str, question: dict[str, Any],
        blobs: list[Any]) -> tuple[dict[str, Any], list[memoryview]]:
  """A compile-time question to the client of `route`; raises its error."""
  return _request(link, {"kind": msg.ASK, "route": route, "what": what,
                         "question": question}, blobs)


class Binding:
  """One compiled program's callbacks on this worker: the stubs XLA calls
  by index, the forwarders its compile needs, and the failure of the launch
  running now."""

  def __init__(self, route: int, count: int, link: Link, raises: bool):
    self.route = route
    self.link = link
    self.raises = raises
    # Per host callback index: its results' types ((dtype, shape), or None
    # for a token), from the program.
    self.results: dict[int, list[tuple[np.dtype, tuple[int, ...]] | None]] = {}
    self.stubs = [functools.partial(self._call, i) for i in range(count)]
    self.keep: list[Any] = []  # forwarders XLA holds by pointer
    self.failure: Status | None = None

  def filler(self, index: int) -> tuple[Any, ...]:
    """Zeros of callback `index`'s results (what a failed one returns)."""
    return tuple(None if t is None else np.zeros(t[1], t[0])
                 for t in self.results.get(index, []))

  def take_failure(self) -> Status | None:
    failure, self.failure = self.failure, None
    return failure

  def _call(self, index: int, *args: Any) -> tuple[Any, ...]:
    """What XLA calls for host callback `index` (its stub)."""
    if self.failure is not None:  # the launch failed: no more calls of it
      return self.filler(index)
    try:
      specs, blobs = msg.pack_arrays(args, "operands")
      header, out = _request(self.link, {"kind": msg.CALL,
                                         "route": self.route, "index": index,
                                         "args": specs}, blobs)
      results = msg.unpack_arrays(header.get("results"), out,
                                  "callback results")
      self._check(index, results)
      return tuple(results)
    except Exception as e:  # pylint: disable=broad-except
      status = (e.status if isinstance(e, StatusError) else
                Status(Code.INTERNAL, str(e)))
      if self.raises:  # XLA words it: "CpuCallback error calling callback"
        raise CallbackError(status.message) from None
      if self.failure is None:
        self.failure = Status(status.code, f"{_FAILED}{status.message}")
      return self.filler(index)

  def _check(self, index: int, results: list[np.ndarray | None]) -> None:
    wanted = self.results.get(index, [])
    got = [None if r is None else (r.dtype, tuple(r.shape)) for r in results]
    if got != wanted:
      raise CallbackError(
          f"host callback {index} returned {_types(got)}; its program "
          f"takes {_types(wanted)}")


def _types(types: list[Any]) -> str:
  return "(" + ", ".join("token" if t is None else
                         f"{t[0].name}{list(t[1])}" for t in types) + ")"


def bind(module: Any, route: int, count: int, link: Link,
         raises: bool) -> Binding:
  """Binds the callbacks of `module` (jaxlib.mlir.ir.Module, checked by
  custom_calls.check; rewritten in place) to `route`."""
  from jax._src.lib import xla_client as xc  # pylint: disable=import-outside-toplevel
  from jaxlib.mlir import ir  # pylint: disable=import-outside-toplevel
  binding = Binding(route, count, link, raises)
  ops: list[Any] = []

  def visit(op: Any) -> Any:
    if op.name == "stablehlo.custom_call":
      ops.append(op)
    return ir.WalkResult.ADVANCE

  module.operation.walk(visit)
  with module.context:
    for op in ops:
      call = custom_calls._custom_call(ir, op)  # pylint: disable=protected-access
      if call.target in custom_calls.HOST_CALLBACKS:
        binding.results[call.index] = [_result_type(ir, r.type)
                                       for r in op.results]
      elif call.target == custom_calls.INSPECT_SHARDING:
        forward = _inspector(link, route, call.backend_config.hex())
        binding.keep.append(forward)
        op.attributes["backend_config"] = ir.StringAttr.get(
            xc.encode_inspect_sharding_callback(forward))
      elif call.target == custom_calls.CUSTOM_PARTITIONING:
        op.attributes["call_target_name"] = ir.StringAttr.get(
            FORWARDED_PARTITIONING)
        op.attributes["backend_config"] = ir.StringAttr.get(
            _PREFIX + str(route).encode() + b":" + call.backend_config)
  return binding


def _result_type(ir: Any, t: Any) -> tuple[np.dtype, tuple[int, ...]] | None:
  """A callback result's (dtype, shape); None for a token. The program
  was checked: anything else is refused at the first call."""
  found = dtypes.tensor_type(t)
  if found is None:
    if not isinstance(t, ir.RankedTensorType):
      return None  # a token
    raise CallbackError(f"host callback result of type {t} is not served")
  return np.dtype(msg.jnp_dtype(found[1])), found[0]


def _inspector(link: Link, route: int, key: str) -> Callable[[Any], None]:
  def forward(sharding: Any) -> None:
    blobs: list[Any] = []
    msg.pack_shardings([sharding], blobs)
    ask(link, route, msg.INSPECT, {"key": key}, blobs)
  return forward


# ----------------------------------------------------- custom partitioning
# The partitioner's way to the clients, and what its answers may call.
_link: Link | None = None
_allow: frozenset[str] = frozenset()
_installed = False


def install(link: Link, allow: frozenset[str]) -> None:
  """Registers this process's partitioner (FORWARDED_PARTITIONING), once;
  its answers may call what `allow` lists."""
  global _link, _allow, _installed
  _link, _allow = link, allow
  if _installed:
    return
  _installed = True
  from jax._src.lib import xla_client as xc  # pylint: disable=import-outside-toplevel
  xc.register_custom_call_partitioner(
      FORWARDED_PARTITIONING, _propagate, _partition, _infer,
      can_side_effecting_have_replicated_sharding=True)


def _split(config: bytes) -> tuple[int, str]:
  config = bytes(config)
  if not config.startswith(_PREFIX):
    raise CallbackError("CustomSPMDPartitioning without a route: the "
                        "program was not bound on this worker")
  route, _, key = config[len(_PREFIX):].partition(b":")
  return int(route), key.decode()


def _ask_partitioner(config: bytes, what: str, shardings: list[Any],
                     **question: Any
                     ) -> tuple[dict[str, Any], list[memoryview]]:
  """Asks the client `config` routes to, about the partitioner `config`
  names, with `shardings` and the rest of `question`."""
  route, key = _split(config)
  blobs: list[Any] = []
  refs = msg.pack_shardings(shardings, blobs)
  return ask(_link, route, what, {"key": key, **question, "shardings": refs},
             blobs)


def _shapes(arg_shapes: Any, result_shape: Any) -> dict[str, Any]:
  return {"args": [msg.shape_spec(s) for s in arg_shapes],
          "result": msg.shape_spec(result_shape)}


def _propagate(user_sharding: Any, shape: Any, config: bytes) -> Any:
  header, out = _ask_partitioner(config, msg.PROPAGATE, [user_sharding],
                                 shape=msg.shape_spec(shape))
  return msg.unpack_shardings(header.get("shardings"), out, "answer")[0]


def _infer(arg_shapes: Any, arg_shardings: Any, result_shape: Any,
           config: bytes) -> Any:
  header, out = _ask_partitioner(config, msg.INFER, list(arg_shardings),
                                 **_shapes(arg_shapes, result_shape))
  return msg.unpack_shardings(header.get("shardings"), out, "answer")[0]


def _partition(arg_shapes: Any, arg_shardings: Any, result_shape: Any,
               result_sharding: Any, config: bytes) -> Any:
  header, out = _ask_partitioner(config, msg.PARTITION,
                                 [*arg_shardings, result_sharding],
                                 **_shapes(arg_shapes, result_shape))
  module = header.get("module")
  if type(module) is not int or not 0 <= module < len(out):  # pylint: disable=unidiomatic-typecheck
    raise CallbackError("the client's partition answer has no module")
  code = bytes(out[module])
  _check_answer(code)
  shardings = msg.unpack_shardings(header.get("shardings"), out, "answer")
  if len(shardings) != len(arg_shapes) + 1:
    raise CallbackError(f"the client's partition answer has "
                        f"{len(shardings)} shardings for "
                        f"{len(arg_shapes)} arguments and a result")
  return code, shardings[:-1], shardings[-1]


def _check_answer(code: bytes) -> None:
  """A partition answer is a program XLA inlines: it may call only what
  the islands run, and no callbacks (nothing would bind them)."""
  from jax._src.interpreters import mlir  # pylint: disable=import-outside-toplevel
  from jaxlib.mlir import ir  # pylint: disable=import-outside-toplevel
  context = mlir.make_ir_context()
  try:
    with context:
      content = custom_calls.read(ir.Module.parse(code))
  except Exception as e:  # pylint: disable=broad-except
    raise CallbackError(f"the client's partition answer does not read as "
                        f"a program: {e}") from None
  try:
    custom_calls.check(content, _allow, "The partitioned program",
                       serves_callbacks=False)
  except StatusError as e:
    raise CallbackError(e.status.message) from None
