"""PjrtBackend: runs programs and moves arrays on this worker's devices.

Execution goes through PJRT, the same XLA that lowered the client's
program, so results are bit-identical to running the program in the client's
process. The island's client is jaxlib's CPU client (emulated devices) or,
for another platform, the client JAX's own PJRT plugin for it makes
(island_client.py; see BUILD.md). This module, island_client.py and
program_metadata.py are the worker's only ones that touch jaxlib.

A worker has two clients:
  * the island client, with in-process collectives, for programs and arrays
    within the island (most of them);
  * when the cluster has several CPU islands, a global client that sees every
    island's devices (jaxlib's multi-process CPU client: the controller hosts
    the coordination service, collectives go over gloo), for programs and
    arrays that span islands. Island-local collectives on it would cost ~5x
    more (measured: 1.7 ms vs 0.3 ms for a 4-device psum), hence two.
Arrays move between the two (a host copy) when a program on one client gets
an argument from the other.

The global client has generations (controller/coordination.py): once
every island's worker is up, and again after a lost island's place is
taken, every worker builds the next one on a thread of its own
(start_join) while its op loop goes on; the first op that needs it waits
for it (bounded) and makes it current. The older client stays
alive, with its arrays, programs and any threads stuck in the lost worker's
collectives, but nothing new runs on it.
"""
from __future__ import annotations

import base64
import concurrent.futures
import dataclasses
import functools
import hashlib
import threading
import time
from typing import Any, Callable, Hashable, NamedTuple, Sequence

import numpy as np
from absl import logging

import jax
from jax._src import core as jax_core
from jax._src import sharding_impls
from jax._src import util as jax_util
from jax._src import xla_bridge
from jax._src.interpreters import mlir
from jax._src.lax import linalg
from jax._src.lib import _jax
from jax._src.lib import xla_client as xc
from jax._src.lib.mlir import ir

from jax_pathways import threads
from jax_pathways import validation
from jax_pathways.cluster import cores
from jax_pathways.programs import custom_calls
from jax_pathways.status import (Code, StatusError, invalid_argument,
                                 unimplemented)
from jax_pathways.worker import callback_binding as worker_callbacks
from jax_pathways.worker import island_client
from jax_pathways.worker import order_reductions
from jax_pathways.worker import program_metadata
from jax_pathways.worker import shards
from jax_pathways.worker.compilation_cache import CompilationCache

# Seconds a worker waits for every island to join the global client, and the
# coordination service's heartbeat timeout.
JOIN_TIMEOUT_S = 120
HEARTBEAT_TIMEOUT_S = 30
# How long an op waits for a global client being built (its build gives up
# after JOIN_TIMEOUT_S connecting, plus the topology exchange).
JOIN_WAIT_S = JOIN_TIMEOUT_S + 30
# How often an op waiting for a build looks for a lost island's notice.
LOSS_POLL_S = 0.1

DeviceRef = Any  # an island-local index (int) or [island, index]
# Distinct shardings a worker keeps built (a program's arrays use a few).
SHARDING_CACHE_SIZE = 1024
# Checked argument layouts a program keeps per parameter.
ARGUMENT_LAYOUTS_KEPT = 8


def spec_key(spec: dict[str, Any]) -> Hashable:
  """A sharding spec (see PjrtBackend.sharding) as a dict key."""
  return (tuple(r if isinstance(r, int) else tuple(r)
                for r in spec["devices"]),
          spec.get("op_sharding"), spec.get("memory_kind"))


def host_view(data: memoryview, dtype: str, shape: Sequence[int],
              strides: Sequence[int] | None) -> np.ndarray:
  """A numpy view of an op's payload bytes. It keeps the payload alive for
  as long as a device array may alias it (PJRT CPU can put without copying).
  The controller checked the shape and strides; they are checked again
  here, as nothing on the wire is trusted with this process's memory."""
  np_type, shape, strides = _checked_view(
      dtype, tuple(shape), None if strides is None else tuple(strides),
      memoryview(data).nbytes)
  # ndarray() bounds-checks the strides against the buffer once more.
  return np.ndarray(shape, np_type, buffer=data, strides=strides)


@functools.lru_cache(maxsize=1024)
def _checked_view(dtype: str, shape: tuple[Any, ...],
                  strides: tuple[Any, ...] | None, nbytes: int
                  ) -> tuple[np.dtype, tuple[int, ...], tuple[int, ...] | None]:
  """host_view's checks, once per kind of view (a loop puts the same few;
  an error is raised every time, never kept)."""
  np_type = np_dtype(dtype)
  checked = validation.check_shape(shape, np_type.itemsize, "PUT")
  validation.check_host_buffer(checked, np_type.itemsize, strides, nbytes,
                               "PUT")
  return np_type, checked, None if strides is None else tuple(
      int(s) for s in strides)


def np_dtype(name: str) -> np.dtype:
  return np.dtype(jax.numpy.dtype(name))


# How long the devices of a program with callbacks wait in a collective
# for one of them in a callback (a callback may wait for its user), and
# after how long XLA logs that they wait.
CALLBACK_WAIT_S = 7 * 24 * 3600
CALLBACK_WARN_S = 600

# A parameter as execute() checks it: global shape, dtype, and the shape of
# each shard (None where unknown); None for a parameter not checked.
Parameter = tuple[tuple[int, ...], np.dtype, tuple[int, ...] | None] | None


@dataclasses.dataclass(eq=False)
class Program:
  """A compiled program and what is needed to run it fast."""
  executable: Any
  client: Any
  devices: tuple[Any, ...]
  out_handlers: list[Any]
  metadata: dict[str, Any]
  parameters: list[Parameter]
  # Its callbacks into its client's process (worker/callback_binding.py).
  callbacks: worker_callbacks.Binding | None = None
  # Per parameter, the argument layouts execute() has checked, by the
  # identity of their sharding (the entry holds it, so the id is not
  # reused): (sharding, shape, dtype). Arrays a program makes share their
  # result handler's sharding object, so a loop checks once.
  checked: list[dict[int, tuple[Any, Any, Any]]] = dataclasses.field(
      init=False)

  def __post_init__(self):
    self.checked = [{} for _ in self.parameters]


class Execution:
  """One launch's completion. Its outputs do not tell: a later launch that
  donates one (a gradient sum carried from backward to backward) leaves it
  reading as ready at once, while this launch may not have run yet."""

  def __init__(self, token: Any, outputs: Sequence[jax.Array],
               client: Any = None):
    self._token = token
    self._outputs = outputs
    self.client = client  # the PJRT client the program ran on

  def is_deleted(self) -> bool:
    return False

  def is_ready(self) -> bool:
    """Known without waiting only while no output has been donated, and
    only through outputs (a program without any reads as not ready)."""
    return bool(self._outputs) and all(
        not o.is_deleted() and o.is_ready() for o in self._outputs)

  def block_until_ready(self) -> None:
    self._token.block_until_ready()


class Join(NamedTuple):
  """A generation of the global client being built."""
  generation: int
  future: concurrent.futures.Future  # -> GlobalGeneration
  members: tuple[int, ...]
  # Losses arrived but not handled yet (Executor.pending_losses: (island,
  # upto, why)): a wait for the build gives up on one of `members`.
  pending_losses: Callable[[], Sequence[tuple[int, int, str]]]


class GlobalGeneration(NamedTuple):
  """One generation of the islands' global client, as this worker sees it."""
  client: Any
  distributed_client: Any  # kept alive for as long as `client`
  devices: dict[tuple[int, int], Any]  # (island, index) -> device
  local: tuple[Any, ...]  # this island's devices, in island order
  members: tuple[int, ...]  # its islands; node i is island members[i]


class PjrtBackend:
  """One worker's devices, compiled programs and the arrays they produce."""

  def __init__(self, num_devices: int | None,
               device_cores: list[int] | None = None,
               platform: str | None = "cpu",
               compilation_cache: CompilationCache | None = None):
    """num_devices, platform: see island_client.island_client (raises
    PlatformError).
    device_cores: where the devices' threads run (cluster/cores.py);
    the caller pins the island client's, global clients pin their own.
    compilation_cache: compiled programs kept across workers, or None."""
    # Programs lowered by the client may call LAPACK kernels, whose function
    # pointers jaxlib fills in lazily in the process that lowers; this one
    # only runs them (as jax.export does for deserialized modules).
    linalg.initialize_lapack()
    self.client = island_client.island_client(platform, num_devices)
    self.platform: str = island_client.jax_platform(platform, self.client)
    if self.spans_islands:
      # JAX's own calls in this process (device_put, make_array_...) run on
      # its 'cpu' backend: the global client when there is one, so that JAX
      # sees this process as one of several (which arrays are addressable
      # here). Until the first generation is built, that is the island
      # client; each generation made current clears JAX's cache.
      xla_bridge.register_backend_factory(
          "cpu", lambda: self.global_client or self.client, priority=0,
          fail_quietly=False)
    self.devices = tuple(sorted(self.client.local_devices(),
                                key=lambda d: d.id))
    # jaxlib makes a DeviceList's iterator type at its first iteration;
    # two compile threads making it at once, one got a half-made type
    # ("iter() returned non-iterator of type 'ifrt_device_iterator'").
    # Made here, before any compile thread.
    tuple(xc.DeviceList(self.devices))
    self._device_cores = device_cores
    # This worker's island and the host gloo listens on (set by main).
    self.island = 0
    self.gloo_host = "127.0.0.1"
    # Earlier generations, alive while anything of theirs may run.
    self._retired: list[GlobalGeneration] = []
    self._current: GlobalGeneration | None = None
    # A generation being built (Join), guarded by _join_lock.
    self._join_lock = threading.Lock()
    self._joining: Join | None = None
    # Float all-reduces of programs across islands add in the order one
    # host would (order_reductions); off: gloo's ring order.
    self.rank_order_reductions = True
    self._cache: dict[str, Program] = {}  # compile key -> Program
    self._compilation_cache = compilation_cache
    self._built_shardings: dict[Hashable, jax.sharding.Sharding] = {}
    # MLIR contexts by thread: programs compile on several at once.
    self._contexts = threading.local()
    # What programs here may call (programs/custom_calls.py), and the
    # connection their callbacks take to the controller (set by main).
    self.allowed_custom_calls = custom_calls.allowed(
        custom_calls.registered(self.platform))
    self.callback_link: worker_callbacks.Link | None = None

  @property
  def _ir_context(self) -> Any:
    """This thread's MLIR context (one is not shared between threads)."""
    context = getattr(self._contexts, "context", None)
    if context is None:
      context = self._contexts.context = mlir.make_ir_context()
    return context

  @property
  def global_client(self) -> Any:
    """The current generation's client; None until one is made current."""
    return None if self._current is None else self._current.client

  @property
  def spans_islands(self) -> bool:
    """Whether this island can join a global client with the others: only
    CPU islands (gloo) so far; other platforms' islands run island-local
    programs only."""
    return self.platform == "cpu"

  def start_join(self, members: Sequence[int], coordinator: str,
                 generation: int,
                 pending_losses: Callable[[], Sequence[tuple[int, int, str]]]
                 ) -> concurrent.futures.Future:
    """Builds generation `generation` of the global client on a thread of
    its own (every island's worker does at once); the first op that needs
    it makes it current (current_global). pending_losses: see Join."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    started = time.monotonic()

    def build() -> None:
      try:
        future.set_result(self._build_global(members, coordinator))
      except BaseException as e:  # pylint: disable=broad-except
        logging.error("could not build the islands' global client "
                      "generation %d: %s", generation, e)
        future.set_exception(e)
        return
      logging.info("global client generation %d built in %.3f s",
                   generation, time.monotonic() - started)

    with self._join_lock:
      self._joining = Join(generation, future, tuple(members),
                           pending_losses)
    threads.start(build, "jp-join-global")
    return future

  def _build_global(self, members: Sequence[int], coordinator: str
                    ) -> GlobalGeneration:
    # After a loss the islands left build one of their own: its nodes are
    # numbered 0.. in island order.
    members = tuple(sorted(members))
    node = members.index(self.island)
    with cores.pinned(self._device_cores):  # its device threads inherit it
      distributed = _jax.get_distributed_runtime_client(
          coordinator, node, init_timeout=JOIN_TIMEOUT_S,
          heartbeat_timeout=HEARTBEAT_TIMEOUT_S,
          shutdown_on_destruction=False)
      distributed.connect()
      collectives = _jax.make_gloo_tcp_collectives(
          distributed_client=distributed, hostname=self.gloo_host)
      client = xc.make_cpu_client(
          asynchronous=True, distributed_client=distributed,
          node_id=node, num_nodes=len(members), collectives=collectives,
          num_devices=len(self.devices))
    by_process: dict[int, list[Any]] = {}
    for d in client.devices():
      by_process.setdefault(d.process_index, []).append(d)
    devices = {(members[p], i): d for p, ds in by_process.items()
               for i, d in enumerate(sorted(ds, key=lambda d: d.id))}
    return GlobalGeneration(
        client, distributed, devices,
        tuple(devices[(self.island, i)] for i in range(len(self.devices))),
        members)

  def _install(self, built: GlobalGeneration) -> None:
    if self._current is not None:
      self._retired.append(self._current)
    self._current = built
    # Programs and shardings name devices by (island, index): from now on
    # those of the new client.
    self._cache = {k: p for k, p in self._cache.items()
                   if p.client is self.client}
    self._built_shardings.clear()
    # JAX's 'cpu' backend is the current global client (see __init__):
    # also forget what JAX's caches keep of the earlier one (get_backend,
    # process_index's client: which devices are addressable here).
    xla_bridge._clear_backends()  # pylint: disable=protected-access
    jax_util.clear_all_caches()

  def current_global(self) -> Any:
    """The current global client (None: none); waits for one being built
    and makes it current. Raises UNAVAILABLE if it could not be built."""
    with self._join_lock:
      if self._joining is not None:
        generation = self._joining.generation
        try:
          built = self._wait_built(self._joining)
        except concurrent.futures.TimeoutError:
          raise StatusError(
              Code.UNAVAILABLE,
              f"the islands' global client (generation {generation}) is "
              f"not built after {JOIN_WAIT_S} s") from None
        except Exception as e:  # pylint: disable=broad-except
          raise StatusError(
              Code.UNAVAILABLE,
              f"could not build the islands' global client (generation "
              f"{generation}): {e}") from None
        self._joining = None
        self._install(built)
      return self.global_client

  def _wait_built(self, join: Join) -> GlobalGeneration:
    """The build's result, waited for up to JOIN_WAIT_S; raises DATA_LOSS
    at once if one of its islands is lost meanwhile (the build would wait
    for that island's worker until JOIN_TIMEOUT_S)."""
    deadline = time.monotonic() + JOIN_WAIT_S
    while True:
      try:
        return join.future.result(timeout=min(LOSS_POLL_S, max(
            0.0, deadline - time.monotonic())))
      except concurrent.futures.TimeoutError:
        if time.monotonic() >= deadline:
          raise
      lost = [i for i, _, _ in join.pending_losses() if i in join.members]
      if lost:
        raise StatusError(Code.DATA_LOSS,
                          f"island {lost[0]} was lost while it was built")

  def abandon_join(self, island: int, why: str) -> None:
    """Island `island` was lost: a generation being built with it is not
    waited for any more (ops that need it fail at once, until the next
    generation's JOIN_GLOBAL); its build ends by itself in jaxlib."""
    with self._join_lock:
      if self._joining is None or island not in self._joining.members:
        return
      failed: concurrent.futures.Future = concurrent.futures.Future()
      failed.set_exception(StatusError(
          Code.DATA_LOSS, f"island {island} was lost while it was built "
          f"({why})"))
      self._joining = self._joining._replace(future=failed)

  def in_global(self, island: int) -> bool:
    """Whether `island` is in the current or the coming generation of the
    global client (a loss outside both breaks nothing here)."""
    with self._join_lock:
      if self._joining is not None and island in self._joining.members:
        return True
    return self._current is not None and island in self._current.members

  # ----------------------------------------------------------------- devices
  def _settle(self, refs: Sequence[DeviceRef]) -> None:
    """Makes a global client being built current first if `refs` name
    global devices: cached programs and shardings name them by (island,
    index), which from then on are the new client's."""
    if self._joining is not None and not all(isinstance(r, int)
                                             for r in refs):
      self.current_global()

  def device(self, ref: DeviceRef) -> Any:
    if isinstance(ref, int):
      return self.devices[ref]
    if not self.spans_islands:
      raise unimplemented(
          f"island {self.island} runs on {self.platform}: programs and "
          f"arrays that span islands need CPU islands so far (each "
          f"island's own programs run)")
    if self.current_global() is None:
      raise ValueError("this worker has no global client: the cluster has "
                       "one island")
    return self._current.devices[tuple(ref)]

  def sharding(self, spec: dict[str, Any]) -> jax.sharding.Sharding:
    """{'devices': [refs], 'op_sharding': base64 | None} -> Sharding.
    Cached: a pipeline step names the same few shardings in every op, and
    building one costs more than the rest of issuing a launch."""
    self._settle(spec["devices"])
    key = spec_key(spec)
    sharding = self._built_shardings.get(key)
    if sharding is None:
      if len(self._built_shardings) >= SHARDING_CACHE_SIZE:
        self._built_shardings.clear()
      sharding = self._built_shardings[key] = self._make_sharding(spec)
    return sharding

  def _make_sharding(self, spec: dict[str, Any]) -> jax.sharding.Sharding:
    devices = tuple(self.device(r) for r in spec["devices"])
    memory_kind = spec.get("memory_kind")
    if spec.get("op_sharding") is None:
      if len(devices) == 1:
        return jax.sharding.SingleDeviceSharding(devices[0],
                                                 memory_kind=memory_kind)
      return sharding_impls.GSPMDSharding.get_replicated(
          devices, memory_kind=memory_kind)
    op = xc.OpSharding()
    op.ParseFromString(base64.b64decode(spec["op_sharding"]))
    return sharding_impls.GSPMDSharding(devices, op, memory_kind=memory_kind)

  def on_client(self, array: jax.Array, client: Any) -> jax.Array:
    """`array` on `client`'s devices of the same island (copying if needed)."""
    source = _client(array)
    if source is client:
      return array
    if source is not self.client and source is not self.global_client:
      # Made before the islands up changed: data lost with the change,
      # and what a client's retry logic (elastic, pathwaysutils) reads so.
      raise StatusError(
          Code.DATA_LOSS,
          "the array belongs to an earlier generation of the islands' "
          "global client, lost with an island's worker")
    if client is self.client:
      table = dict(zip(self._current.local, self.devices))
    else:
      table = dict(zip(self.devices, self._current.local))
    parts = [jax.device_put(np.asarray(s), table[s.device])
             for s in self.shards(array)]
    devices = tuple(table[d] for d in array.sharding._device_assignment)  # pylint: disable=protected-access
    sharding = (jax.sharding.SingleDeviceSharding(devices[0])
                if len(devices) == 1 else sharding_impls.GSPMDSharding(
                    devices, array.sharding._to_xla_hlo_sharding(array.ndim)))  # pylint: disable=protected-access
    return jax.make_array_from_single_device_arrays(array.shape, sharding,
                                                    parts)

  # ----------------------------------------------------------------- programs
  def compile(self, program: bytes, options: bytes, device_refs: list[DeviceRef],
              replicas: int, callbacks: dict[str, Any] | None = None
              ) -> Program:
    """`callbacks`: {"route", "count"}, the route the controller serves the
    program's callbacks by (worker/callback_binding.py); None: it has none."""
    self._settle(device_refs)
    route = int(callbacks["route"]) if callbacks else 0
    # Programs of several clients may be the same bytes; their callbacks
    # are not the same (route).
    key = hashlib.sha256(program + b"|" + options + b"|" +
                         repr((device_refs, route)).encode()).hexdigest()
    cached = self._cache.get(key)
    if cached is not None:
      return cached
    devices = tuple(self.device(r) for r in device_refs)
    client = devices[0].client
    module = self._parse(program)
    binding = self._bind(module, callbacks, len(devices))
    compile_options = xc.CompileOptions.ParseFromString(options)
    # The client compiled for its own device ids; these are this worker's.
    compile_options.device_assignment = xc.DeviceAssignment.create(
        np.array([d.id for d in devices]).reshape(replicas, -1))
    outputs, parameters, passes_tokens = program_metadata.signature(
        module, self._ir_context)
    # jaxlib 0.10.2's XLA:CPU crashes (SIGSEGV) serializing a program that
    # passes a token over several devices: the compilation cache holds none.
    executable, runner = self._compiled(
        program, client, xc.DeviceList(devices), compile_options, replicas,
        client is self.global_client and self.rank_order_reductions,
        module, binding, cacheable=not passes_tokens)
    out_shardings = executable.get_output_shardings()
    handlers = []
    for i, (shape, dtype) in enumerate(outputs):
      if out_shardings is None:
        sharding = (jax.sharding.SingleDeviceSharding(devices[0])
                    if len(devices) == 1 else
                    sharding_impls.GSPMDSharding.get_replicated(devices))
      else:
        sharding = sharding_impls.GSPMDSharding(devices, out_shardings[i])
      aval = jax_core.ShapedArray(shape, np_dtype(dtype))
      handlers.append(xc.array_result_handler(aval, sharding, committed=True,
                                              _skip_checks=True))
    metadata = program_metadata.describe(runner, outputs)
    metadata["donated_input_indices"] = program_metadata.donated(runner)
    if replicas > 1:  # @main has per-replica shapes: only the count holds
      parameters = [None] * len(parameters)
    metadata["parameters"] = [
        None if p is None else {"shape": list(p[0]), "dtype": p[1]}
        for p in parameters]
    # What the client sees of a rank-ordered program is the program it sent.
    for field in ("output_shardings", "parameter_shardings"):
      metadata[field] = program_metadata.encoded_shardings(
          getattr(executable, f"get_{field}")())
    prog = Program(runner, client, devices, handlers, metadata,
                   _parameters(parameters, devices,
                               executable.get_parameter_shardings()),
                   binding)
    self._cache[key] = prog
    return prog

  @staticmethod
  def release_host_pieces() -> None:
    """Lets go now of the host pieces deleted arrays aliased (from_pieces):
    PJRT drops them through Python references jaxlib defers and releases
    only when it next collects them, so an upload's bytes would outlive its
    array while the worker idles (256 MiB resident after the array was
    gone, tests/controller/heap_trim_test.py)."""
    _jax.collect_garbage()

  def forget(self, program: Program) -> None:
    """Drops `program` from the programs kept in memory: its compiled code
    is freed once no launch holds it (the disk cache keeps its entry)."""
    self._cache = {k: p for k, p in self._cache.items() if p is not program}

  def _parse(self, program: bytes) -> Any:
    """The program as an MLIR module of this worker's context."""
    with self._ir_context:
      try:
        return _jax.mlir.deserialize_portable_artifact(program,
                                                       self._ir_context)
      except Exception:  # pylint: disable=broad-except
        return ir.Module.parse(program)  # plain bytecode or text

  def _bind(self, module: Any, callbacks: dict[str, Any] | None,
            num_devices: int) -> worker_callbacks.Binding | None:
    """Checks the program's custom calls again (the controller did:
    nothing on the wire is trusted with this process) and binds its
    callbacks (rewriting `module`); None if it has none."""
    with self._ir_context:
      content = custom_calls.read(module)
    checked = custom_calls.check(
        content, self.allowed_custom_calls, "The program",
        serves_callbacks=callbacks is not None and self.callback_link
        is not None)
    if not checked.any:
      return None
    if checked.count != int(callbacks["count"]):
      raise invalid_argument(
          f"the program binds {checked.count} host callbacks, "
          f"the controller said {callbacks['count']}")
    if checked.compile_time:
      worker_callbacks.install(self.callback_link, self.allowed_custom_calls)
    # On one device a failed callback ends its launch at once; on several
    # the others would wait for it in a collective (worker/callback_binding.py).
    return worker_callbacks.bind(module, int(callbacks["route"]),
                                 checked.count, self.callback_link,
                                 raises=num_devices == 1)

  def _compiled(self, program: bytes, client: Any, devices: Any,
                options: Any, replicas: int, rank_ordered: bool, module: Any,
                binding: worker_callbacks.Binding | None,
                cacheable: bool) -> tuple[Any, Any]:
    """(the program compiled as usual, what runs it: the same, or rank
    ordered), loaded from the compilation cache or compiled (and kept
    unless not `cacheable`). With callbacks (`binding`), `module` is the
    program bound to them, compiled with them and never kept: an
    executable loaded from the cache would have no callables bound."""
    key = None if binding or not cacheable else self._cache_key(
        program, client, devices, options, rank_ordered)
    loaded = self._load(key, client, devices, options)
    if loaded is not None:
      return loaded
    source = program if binding is None else module
    if rank_ordered:
      executable, runner = self._compile_rank_ordered(
          source, client, devices, options, replicas, binding)
    else:
      executable = runner = _compile_and_load(client, source, devices,
                                              options, binding)
    self._keep(key, client, executable, runner)
    return executable, runner

  def _cache_key(self, program: bytes, client: Any, devices: Any,
                 options: Any, rank_ordered: bool) -> str | None:
    """The program's compilation cache key; None without a cache."""
    if self._compilation_cache is None:
      return None
    return self._compilation_cache.key(
        jax.__version__.encode(), client.platform.encode(),
        client.platform_version.encode(),
        str(client.process_index()).encode(),  # whose part it loads
        repr([(d.id, d.process_index, d.device_kind)
              for d in devices]).encode(),
        program, options.SerializeAsString(),
        order_reductions.rewrite_version() if rank_ordered else b"")

  def _load(self, key: str | None, client: Any, devices: Any, options: Any
            ) -> tuple[Any, Any] | None:
    """(executable, runner) kept under `key` (None: no cache), or None."""
    blobs = self._compilation_cache.get(key) if key else None
    if blobs is None:
      return None
    try:
      executable = client.deserialize_executable(blobs[0], devices, options)
      runner = executable if len(blobs) == 1 else (
          client.deserialize_executable(
              blobs[1], devices,
              order_reductions.partitioned_options(options)))
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("compilation cache: entry %s not loaded (%s); "
                      "compiling", key, e)
      self._compilation_cache.drop(key)
      return None
    logging.info("%s: loaded from the compilation cache",
                 executable.hlo_modules()[0].name)
    return executable, runner

  def _keep(self, key: str | None, client: Any, executable: Any,
            runner: Any) -> None:
    """Stores (executable, runner) under `key` in the compilation cache
    (None: no cache)."""
    if not key:
      return
    try:
      self._compilation_cache.put(key, [
          client.serialize_executable(e) for e in
          ((executable,) if runner is executable else (executable, runner))])
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("compilation cache: %s not kept (%s)",
                      executable.hlo_modules()[0].name, e)

  def _compile_rank_ordered(self, source: Any, client: Any, devices: Any,
                            options: Any, replicas: int,
                            binding: worker_callbacks.Binding | None
                            ) -> tuple[Any, Any]:
    """(the program compiled as usual, the same program with its float
    all-reduces combined in rank order: see order_reductions)."""
    executable, partitioned = order_reductions.partitioned_module(
        lambda opts: _compile_and_load(client, source, devices, opts,
                                       binding), options)
    try:
      if partitioned is None:
        raise order_reductions.NotRewritten(
            "XLA wrote no module after its SPMD partitioner")
      text, rewritten = order_reductions.order_reductions(
          self._ir_context, partitioned, replicas,
          {e.parameter_number: e.output_shape_index[0] if e.output_shape_index
           else 0 for e in program_metadata.aliases(executable)})
      if not rewritten:
        return executable, executable
      if binding is not None:
        with self._ir_context:
          text = ir.Module.parse(text)
      runner = _compile_and_load(
          client, text.encode() if binding is None else text, devices,
          order_reductions.partitioned_options(options), binding)
      logging.info("%s: %d float reductions combined in rank order",
                   executable.hlo_modules()[0].name, rewritten)
      return executable, runner
    except Exception as e:  # pylint: disable=broad-except
      # Still correct, only not bit-identical to one host: say so, run it.
      logging.warning("%s: float sums across islands keep gloo's order (%s)",
                      executable.hlo_modules()[0].name, e)
      return executable, executable

  def execute(self, program: Program, args: Sequence[jax.Array]
              ) -> tuple[list[jax.Array], "Execution"]:
    """Enqueues `program` on `args`: its outputs (futures) and the launch's
    own completion. The arguments are checked first: PJRT trusts them, and
    a missing one crashes the process."""
    if len(args) != len(program.parameters):
      raise ValueError(f"{program.metadata['name']} takes "
                       f"{len(program.parameters)} arguments, not {len(args)}")
    moved = False
    for i, (a, p, checked) in enumerate(zip(args, program.parameters,
                                            program.checked)):
      sharding = a.sharding
      seen = checked.get(id(sharding))
      if (seen is not None and seen[0] is sharding and seen[1] == a.shape and
          seen[2] == a.dtype):
        continue
      self._check_argument(program, i, a, p)
      moved = moved or _client(a) is not program.client
      if not moved:
        if len(checked) >= ARGUMENT_LAYOUTS_KEPT:
          checked.clear()
        checked[id(sharding)] = (sharding, a.shape, a.dtype)
    if moved:
      args = [self.on_client(a, program.client) for a in args]
    results = program.executable.execute_sharded(args, with_tokens=True)
    done = results.consume_token()
    outputs = results.consume_with_handlers(program.out_handlers)
    return outputs, Execution(done, outputs, program.client)

  @staticmethod
  def _check_argument(program: Program, i: int, a: jax.Array,
                      p: Parameter) -> None:
    """Raises ValueError unless `a` fits parameter `i` (`p`)."""
    if len(a.sharding.device_set) != len(program.devices):
      raise ValueError(f"{program.metadata['name']}: argument {i} is on "
                       f"{len(a.sharding.device_set)} devices, the "
                       f"program runs on {len(program.devices)}")
    if p is None:
      return
    shape, dtype, shard_shape = p
    if (a.shape, a.dtype) != (shape, dtype):
      raise ValueError(f"{program.metadata['name']}: argument {i} is "
                       f"{a.dtype}{list(a.shape)}, the program takes "
                       f"{dtype}{list(shape)}")
    if shard_shape is None:
      return
    got = _shard_shape(a.sharding, shape)
    if got != shard_shape:
      raise ValueError(f"{program.metadata['name']}: argument {i} comes "
                       f"in shards of {got}, the program takes shards of "
                       f"{shard_shape}")

  # ----------------------------------------------------------------- arrays
  @staticmethod
  def mine(sharding: jax.sharding.Sharding) -> list[Any]:
    """The sharding's devices on this worker, in its device order."""
    return [d for d in sharding._device_assignment  # pylint: disable=protected-access
            if d.process_index == d.client.process_index()]

  def from_host(self, host: np.ndarray, sharding: jax.sharding.Sharding
                ) -> jax.Array:
    """An array with `host`'s values, built from this worker's shards only
    (the sharding may span islands)."""
    mine = self.mine(sharding)
    if len(sharding._device_assignment) == 1:  # pylint: disable=protected-access
      return self.from_pieces(host.shape, sharding, [host], mine)
    index = sharding.devices_indices_map(host.shape)
    return self.from_pieces(host.shape, sharding,
                            [host[index[d]] for d in mine], mine)

  @staticmethod
  def from_pieces(shape: Sequence[int], sharding: jax.sharding.Sharding,
                  pieces: Sequence[np.ndarray], devices: Sequence[Any]
                  ) -> jax.Array:
    """An array from host pieces, one per device of this worker in
    `devices` order. PJRT aliases 64-byte aligned pieces instead of copying
    them. (jax.device_put does the same with ~120 us more Python per call.)"""
    aval = jax_core.ShapedArray(tuple(shape), pieces[0].dtype)
    return xc.batched_device_put(aval, sharding, list(pieces), list(devices),
                                 True)

  def assemble(self, shape: Sequence[int], sharding: jax.sharding.Sharding,
               parts: Sequence[jax.Array]) -> jax.Array:
    """An array from single-device arrays, one per addressable device."""
    client = sharding._device_assignment[0].client  # pylint: disable=protected-access
    parts = [self.on_client(p, client) for p in parts]
    by_device = {p.sharding._device_assignment[0]: p for p in parts}  # pylint: disable=protected-access
    ordered = [by_device[d] for d in sharding._device_assignment  # pylint: disable=protected-access
               if d in by_device]
    return jax.make_array_from_single_device_arrays(tuple(shape), sharding,
                                                    ordered)

  @staticmethod
  def shards(array: jax.Array) -> list[jax.Array]:
    """This worker's single-device arrays, in the array's device order."""
    by_device = {s.device: s.data for s in array.addressable_shards}
    return [by_device[d] for d in array.sharding._device_assignment  # pylint: disable=protected-access
            if d in by_device]

  def local_positions(self, refs: Sequence[DeviceRef]) -> list[int]:
    """The positions in `refs` of this worker's devices."""
    return [i for i, r in enumerate(refs)
            if isinstance(r, int) or self.device(r) in self._current.local]

  def first_held(self, spec: dict[str, Any], shape: Sequence[int]
                 ) -> dict[int, int]:
    """The distinct pieces (see shards.distinct) this worker holds first:
    piece number -> its position in the spec's devices."""
    local = set(self.local_positions(spec["devices"]))
    return {k: pos for k, pos in
            enumerate(shards.distinct(shards.indices(spec, shape)))
            if pos in local}

  def pieces(self, array: jax.Array, spec: dict[str, Any],
             shape: Sequence[int]) -> dict[int, np.ndarray]:
    """first_held's pieces, as host arrays."""
    by_position = dict(zip(self.local_positions(spec["devices"]),
                           self.shards(array)))
    return {k: np.asarray(by_position[pos])
            for k, pos in self.first_held(spec, shape).items()}

  def memory_per_device(self) -> int:
    """The smallest device memory the devices report; 0 if they report none
    (CPU devices)."""
    limits = []
    for d in self.devices:
      try:
        stats = d.memory_stats() or {}
      except Exception:  # pylint: disable=broad-except
        stats = {}
      limits.append(int(stats.get("bytes_limit", 0)))
    return min(limits) if limits and all(limits) else 0

  def spans(self, arrays: Sequence[Any]) -> bool:
    """Whether any of `arrays` (or a launch's Execution) is a global
    client's (of any generation): it waits for other islands."""
    return any(_client(a) is not self.client for a in arrays
               if isinstance(a, (Execution, jax.Array)))

  @staticmethod
  def to_host(array: jax.Array, strides: Sequence[int] | None = None
              ) -> np.ndarray:
    """The array's bytes (uint8) in `strides` order (default: row-major).
    On CPU a row-major fetch is a view of the device buffer, sent without a
    copy."""
    host = np.asarray(array)
    if strides is not None and tuple(strides) != host.strides:
      # Dense strides write every byte of `out` once, so none of its
      # earlier contents can leave this process.
      validation.check_dense_strides(host.shape, host.itemsize, strides,
                                     "FETCH")
      out = np.empty_like(host)
      view = np.ndarray(host.shape, host.dtype, buffer=out,
                        strides=tuple(strides))
      view[...] = host
      host = out
    # As bytes: numpy exports no buffer for dtypes such as bfloat16.
    return np.ascontiguousarray(host).reshape(-1).view(np.uint8)


def _client(a: jax.Array | Execution) -> Any:
  """The PJRT client `a` (an array, or a launch's Execution) is on."""
  if isinstance(a, Execution):
    return a.client
  return a.sharding._device_assignment[0].client  # pylint: disable=protected-access


def _compile_and_load(client: Any, source: Any, devices: Any, options: Any,
                      binding: worker_callbacks.Binding | None) -> Any:
  """`source` (program bytes, or an MLIR module) compiled on `client`,
  with the stubs of `binding` as its host callbacks (jaxlib takes those
  with a module only)."""
  if binding is None:
    return client.compile_and_load(source, devices, options)
  return client.compile_and_load(source, devices, options,
                                 host_callbacks=binding.stubs)


def _shard_shape(sharding: jax.sharding.Sharding, shape: tuple[int, ...]
                 ) -> tuple[int, ...] | None:
  try:
    return tuple(sharding.shard_shape(shape))
  except ValueError:  # unevenly sharded: PJRT's own checks apply
    return None


def _parameters(parameters: list[tuple[tuple[int, ...], str] | None],
                devices: tuple[Any, ...], shardings: list[Any] | None
                ) -> list[Parameter]:
  """What execute() checks, from @main's signature (None: unchecked) and
  the compiled parameter shardings (xla.OpSharding, where reported)."""
  if shardings is not None and len(shardings) != len(parameters):
    shardings = None
  out: list[Parameter] = []
  for i, p in enumerate(parameters):
    shard_shape = None
    if p is not None and shardings is not None:
      shard_shape = _shard_shape(
          sharding_impls.GSPMDSharding(devices, shardings[i]), p[0])
    out.append(None if p is None else (p[0], np_dtype(p[1]), shard_shape))
  return out


