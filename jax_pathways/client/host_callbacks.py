"""Callbacks: the client's side of callbacks into the user's process.

JAX hands a program's host callbacks (jax.debug.print, jax.debug.callback,
jax.pure_callback, io_callback) to the compiler beside the program, as
callables by index; JAX's proxy client refuses them. Compile-time callbacks
(jax.debug.inspect_array_sharding, custom_partitioning) live in this
process too, keyed from the program. So this module, in the user's
process:

* at compile (install(): JAX's `backend_compile_and_load`, for the
  proxy client only), keeps the callables in a table and names the table
  in the program (custom_calls.TABLE_ATTRIBUTE) instead of handing them
  to the proxy client;
* records the key JAX writes for each inspect_array_sharding callback
  (`encode_inspect_sharding_callback`; the program carries the key, never
  the pointer, to the worker);
* keeps one gRPC stream open to the controller (CALLBACKS_METHOD), over
  which the controller asks this process to run a callback or answer a
  partitioner's question, and this process replies. Callbacks run on a
  pool of threads, so one that blocks, or itself calls JAX (and so
  another program with callbacks), holds no other.

Both patches are documented in docs/limitations.md; every other backend
(a CPU backend in this process) is left to JAX.
"""
from __future__ import annotations

import concurrent.futures
import functools
import itertools
import queue
import secrets
import threading
import traceback
import weakref
from typing import Any, Callable, Iterator, Sequence

from absl import logging

from jax_pathways.client import synchronous_calls
from jax_pathways.cluster import addresses
from jax_pathways.programs import custom_calls
from jax_pathways.wire import callback_messages as msg
from jax_pathways.wire.session_keys import (CALLBACKS_HEADER, CALLBACKS_METHOD,
                                             TOKEN_HEADER)

# Callbacks running at once: each may block (io_callback waiting for
# input) or call JAX, whose programs may call back again.
POOL_THREADS = 64
# Waits between tries to open the stream again, doubling up to the last.
RECONNECT_S = (1.0, 30.0)

_lock = threading.Lock()
_installed = False
_service: "_Service | None" = None
# Proxy clients whose compiles go through the tables (jaxlib's Client
# objects take no attributes; weakly, by identity).
_ours: "weakref.WeakSet[Any]" = weakref.WeakSet()
_tables: dict[int, Sequence[Callable[..., Any]]] = {}
_table_ids = itertools.count(1)
# inspect_array_sharding's callbacks by the key JAX wrote in the program.
_inspect: "weakref.WeakValueDictionary[bytes, Any]" = (
    weakref.WeakValueDictionary())


def new_client_id() -> str:
  """A fresh id for this process's callbacks (a secret: it routes them)."""
  return secrets.token_hex(16)


def install() -> None:
  """Patches JAX's compile entry and its inspect-sharding key encoder in
  this process. Idempotent."""
  global _installed
  with _lock:
    if _installed:
      return
    _installed = True
  from jax._src import compiler  # pylint: disable=import-outside-toplevel
  from jax._src.lib import xla_client as xc  # pylint: disable=import-outside-toplevel
  compile_and_load = compiler.backend_compile_and_load
  encode_inspect = xc.encode_inspect_sharding_callback

  @functools.wraps(compile_and_load)
  def compile_with_table(backend: Any, module: Any, executable_devices: Any,
                         options: Any, host_callbacks: Sequence[Any]) -> Any:
    """Compiles `module` through the proxy client with its host callbacks
    kept here, named by a table id in the program."""
    if not host_callbacks or backend not in _ours:
      return compile_and_load(backend, module, executable_devices, options,
                              host_callbacks)
    from jaxlib.mlir import ir  # pylint: disable=import-outside-toplevel
    if _service is None:
      raise RuntimeError("jax_pathways: callbacks are not being served in "
                         "this process (jax_pathways.initialize() was not "
                         "run)")
    table = next(_table_ids)
    with _lock:
      _tables[table] = tuple(host_callbacks)
    attributes = module.operation.attributes
    attributes[custom_calls.TABLE_ATTRIBUTE] = ir.StringAttr.get(
        f"{table}:{len(host_callbacks)}", module.context)
    try:
      return synchronous_calls.wrap(
          compile_and_load(backend, module, executable_devices, options, []),
          executable_devices)
    except BaseException:
      forget(table)
      raise
    finally:
      # JAX may compile the same module again (another backend, a retry).
      del attributes[custom_calls.TABLE_ATTRIBUTE]

  def encode_and_record(callback: Any) -> bytes:
    key = encode_inspect(callback)
    _inspect[bytes(key)] = callback
    return key

  compiler.backend_compile_and_load = compile_with_table
  xc.encode_inspect_sharding_callback = encode_and_record
  synchronous_calls.install()


def forget(table: int) -> None:
  with _lock:
    _tables.pop(table, None)


def adopt(client: Any) -> None:
  """`client` (jaxlib's proxy client) compiles through the tables."""
  _ours.add(client)


def start(target: str, token: str | None, client_id: str) -> None:
  """Serves this process's callbacks to the controller at `target`
  (grpc://host:port) under `client_id`, until stop()."""
  global _service
  with _lock:
    if _service is not None and _service.client_id == client_id:
      return
    old, _service = _service, _Service(target, token, client_id)
  if old is not None:
    old.stop()


def serving() -> tuple[str, str | None, str]:
  """(target, token, client id) of the callbacks served now, for start()."""
  service = _service
  if service is None:
    raise RuntimeError("jax_pathways serves no callbacks in this process")
  return service.target, service.token, service.client_id


def stop() -> None:
  global _service
  with _lock:
    service, _service = _service, None
  if service is not None:
    service.stop()


class _Service:
  """The stream to the controller and the pool that runs what it asks."""

  def __init__(self, target: str, token: str | None, client_id: str):
    self.client_id = client_id
    self.target, self.token = target, token
    self._target = addresses.dial_target(target)
    self._metadata = [(CALLBACKS_HEADER, client_id)]
    if token:
      self._metadata.append((TOKEN_HEADER, token))
    self._pool = concurrent.futures.ThreadPoolExecutor(
        POOL_THREADS, thread_name_prefix="jp-callback")
    self._stopped = threading.Event()
    self._out: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
    self._channel: Any = None
    self._thread = threading.Thread(target=self._run, name="jp-callbacks",
                                    daemon=True)
    self._thread.start()

  def stop(self) -> None:
    self._stopped.set()
    self._out.put(None)
    channel = self._channel
    if channel is not None:
      channel.close()
    self._pool.shutdown(wait=False, cancel_futures=True)

  def _run(self) -> None:
    import grpc  # pylint: disable=import-outside-toplevel
    wait = RECONNECT_S[0]
    while not self._stopped.is_set():
      out: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
      self._out = out
      channel = grpc.insecure_channel(
          self._target, options=[("grpc.max_receive_message_length", -1),
                                 ("grpc.max_send_message_length", -1)])
      self._channel = channel
      try:
        stream = channel.stream_stream(CALLBACKS_METHOD,
                                       request_serializer=None,
                                       response_deserializer=None)
        for data in stream(_drain(out), metadata=self._metadata):
          wait = RECONNECT_S[0]  # it was open
          self._pool.submit(self._serve, out, data)
        ended = "the controller ended it"
      except grpc.RpcError as e:
        ended = f"{e.code().name}: {e.details()}"
        if e.code() in (grpc.StatusCode.UNIMPLEMENTED,
                        grpc.StatusCode.UNAUTHENTICATED,
                        grpc.StatusCode.PERMISSION_DENIED):
          if not self._stopped.is_set():
            logging.warning("jax_pathways: the controller does not serve "
                            "this process's callbacks (%s); programs that "
                            "call back into Python will fail", ended)
          return
      except RuntimeError:  # the pool was shut down under us
        return
      finally:
        out.put(None)
        channel.close()
      if self._stopped.wait(wait):
        return
      wait = min(2 * wait, RECONNECT_S[1])
      logging.info("jax_pathways: the callbacks stream ended (%s); "
                   "reconnecting", ended)

  def _serve(self, out: "queue.SimpleQueue[bytes | None]", data: bytes
             ) -> None:
    try:
      header, blobs = msg.decode(data)
    except ValueError as e:
      logging.warning("jax_pathways: dropped a malformed callback message "
                      "from the controller: %s", e)
      return
    kind, call_id = header["kind"], header.get("id", 0)
    if kind == msg.FORGET:
      table = header.get("table")
      if type(table) is int:  # pylint: disable=unidiomatic-typecheck
        forget(table)
      return
    try:
      if kind == msg.CALL:
        reply = _run_callback(header, blobs)
      elif kind == msg.ASK:
        reply = _answer(header, blobs)
      else:
        raise ValueError(f"unknown callback message kind {kind!r}")
      data = msg.encode({"kind": msg.REPLY, "id": call_id, **reply[0]},
                        reply[1])
    except Exception as e:  # pylint: disable=broad-except
      data = msg.encode({"kind": msg.REPLY, "id": call_id,
                         "error": {"code": 13, "message": _describe(e)}})
    out.put(data)


def _drain(out: "queue.SimpleQueue[bytes | None]") -> Iterator[bytes]:
  while True:
    item = out.get()
    if item is None:
      return
    yield item


def _describe(e: BaseException) -> str:
  """A callback's failure as the user reads it: its traceback here."""
  return "".join(traceback.format_exception(e)).strip()


def _run_callback(header: dict[str, Any], blobs: list[memoryview]
                  ) -> tuple[dict[str, Any], list[Any]]:
  table, index = header.get("table"), header.get("index")
  with _lock:
    callables = _tables.get(table)  # type: ignore[arg-type]
  if callables is None or type(index) is not int or not (  # pylint: disable=unidiomatic-typecheck
      0 <= index < len(callables)):
    raise LookupError(f"no host callback {index!r} in table {table!r} of "
                      "this process (its program was released)")
  args = msg.unpack_arrays(header.get("args"), blobs, "callback operands")
  results = callables[index](*args)
  specs, out = msg.pack_arrays(results, "results")
  return {"results": specs}, out


def _answer(header: dict[str, Any], blobs: list[memoryview]
            ) -> tuple[dict[str, Any], list[Any]]:
  """A partitioner's question, answered by JAX's own callbacks here."""
  what, q = header.get("what"), header.get("question")
  if not isinstance(q, dict):
    raise ValueError("malformed compile-time question")
  if what == msg.INSPECT:
    key = bytes.fromhex(str(q.get("key", "")))
    callback = _inspect.get(key)
    if callback is None:
      raise LookupError("inspect_array_sharding's callback is gone from "
                        "this process (its program was released)")
    callback(msg.unpack_shardings([0], blobs, "inspected sharding")[0])
    return {}, []
  from jax._src import custom_partitioning as cp  # pylint: disable=import-outside-toplevel
  key = str(q.get("key", "")).encode()
  shardings = msg.unpack_shardings(q.get("shardings"), blobs, "shardings")
  if what == msg.PROPAGATE:
    result = cp._custom_partitioning_propagate_user_sharding(  # pylint: disable=protected-access
        shardings[0], msg.shape_of(q.get("shape"), "shape"), key)
    out: list[Any] = []
    return {"shardings": msg.pack_shardings([result], out)}, out
  args = [msg.shape_of(s, "argument shape") for s in q.get("args") or []]
  result_shape = msg.shape_of(q.get("result"), "result shape")
  if what == msg.INFER:
    result = cp._custom_partitioning_infer_sharding_from_operands(  # pylint: disable=protected-access
        args, shardings, result_shape, key)
    out = []
    return {"shardings": msg.pack_shardings([result], out)}, out
  if what == msg.PARTITION:
    module, arg_shardings, result_sharding = (
        cp._custom_partitioning_partition(  # pylint: disable=protected-access
            args, shardings[:-1], result_shape, shardings[-1], key))
    out = [module]
    refs = msg.pack_shardings([*arg_shardings, result_sharding], out)
    return {"module": 0, "shardings": refs}, out
  raise ValueError(f"unknown compile-time question {what!r}")
