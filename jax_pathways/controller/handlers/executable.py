"""LoadedExecutable requests: metadata, Execute, and the executable's life.

Execute resolves its arguments, registers its outputs under the client's
handles (or fresh server handles on the first call), hands one LAUNCH op to
the dispatcher and replies at once: the launch runs later, in gang order, and
its failure reaches the user through the poisoned outputs.
"""
from __future__ import annotations

import base64
import concurrent.futures
from typing import Any, Callable

from jax_pathways import dtypes
from jax_pathways.controller.arrays import Array
from jax_pathways.controller.colocated_executable import ColocatedExecutable
from jax_pathways.controller.compile_cache import CompiledProgram
from jax_pathways.controller.mpmd_executable import MpmdExecutable
from jax_pathways.controller.persistence_executable import (
    PersistenceExecutable)
from jax_pathways.controller.profile_executable import ProfileExecutable
from jax_pathways.controller.handlers.future import (new_done_future,
                                                      reply_when_done)
from jax_pathways.controller.handlers.handler_table import handles
from jax_pathways.controller.session import Reply, Session
from jax_pathways.programs import sharding as sharding_lib
from jax_pathways.status import (Status, StatusError, failed_precondition,
                                 invalid_argument, unimplemented)

Executable = (CompiledProgram | MpmdExecutable | ProfileExecutable |
              PersistenceExecutable | ColocatedExecutable)

# Protocol version from which the execution status is fetched with
# LoadedExecutableFetchExecuteResult instead of CheckFuture.
_EXECUTE_RESULT_VERSION = 21
# What reading the profiling program's result (pathwaysutils does not) gets.
_NO_DATA = failed_precondition(
    "the profiling program's result holds no data").status


def _layouts(field_list: Any, field_error: Any, layouts: Any) -> None:
  if isinstance(layouts, dict):  # {"error": ...}: the worker could not say
    field_error.code = 12
    field_error.message = str(layouts.get("error"))
    return
  field_list.SetInParent()
  for minor_to_major in layouts:
    field_list.layouts.add().minor_to_major.extend(minor_to_major)


@handles("loaded_executable_metadata_request")
def metadata(session: Session, req: Any, reply: Reply) -> None:
  exe: Executable = session.executables.get(req.loaded_executable_handle)
  meta = exe.metadata

  def fill(r: Any) -> None:
    for name in ("parameter_shardings", "output_shardings"):
      shardings = meta[name]
      if shardings is not None:
        lst = getattr(r, name)
        lst.SetInParent()
        for s in shardings:
          lst.shardings.add().ParseFromString(base64.b64decode(s))
    _layouts(r.parameter_layouts_list, r.parameter_layouts_error,
             meta["parameter_layouts"])
    _layouts(r.output_layouts_list, r.output_layouts_error,
             meta["output_layouts"])
    r.output_memory_kinds.SetInParent()
    for kinds in meta["output_memory_kinds"]:
      r.output_memory_kinds.memory_kind_lists.add().memory_kinds.extend(kinds)
    r.donated_input_indices.SetInParent()
    r.donated_input_indices.donated_input_indices.extend(
        meta["donated_input_indices"])
    stats = r.compiled_memory_stats
    for k, v in meta["memory_stats"].items():
      setattr(stats, k, v)
    r.size_of_generated_code_in_bytes = meta.get("code_size", 0)

  reply.ok(fill)


@handles("loaded_executable_execute_request",
         results=lambda r: list(r.result_array_handle))
def execute(session: Session, req: Any, reply: Reply) -> None:
  # Before ensure_current: a loss or rejoin after it changes the epoch, and
  # the fast path then leaves the next call to this handler again.
  epoch = session.services.dispatcher.epoch
  exe: Executable = session.executables.get(req.loaded_executable_handle)
  args: list[Array] = [session.arrays.get(h) for h in req.args_handles]
  outputs = exe.outputs
  first_call = not req.result_array_handle
  if first_call:
    handles_ = [session.server_handles.new() for _ in outputs]
  elif len(req.result_array_handle) != len(outputs):
    raise invalid_argument(
        f"Execute names {len(req.result_array_handle)} result handles for a "
        f"program with {len(outputs)} outputs")
  else:
    handles_ = list(req.result_array_handle)
  fill_status = req.execute_options.fill_status
  status_handle = req.result_status_handle
  if fill_status and not status_handle:
    status_handle = session.server_handles.new()

  failure = _failure(session, exe, args)
  shardings = exe.output_shardings
  buffers = session.services.dispatcher.new_buffers(len(outputs))
  status_future: concurrent.futures.Future | None = (
      concurrent.futures.Future() if fill_status else None)
  if failure is not None:
    if first_call:
      raise StatusError(failure.code, failure.message)
    for h in handles_:
      session.arrays.put(h, Array.failed(failure))  # chosen by the client
    if status_future is not None:
      status_future.set_result(failure)
  else:
    # A program with callbacks stays with Python, which counts its
    # launches in flight (CompiledProgram.when_idle).
    fast = (isinstance(exe, (CompiledProgram, MpmdExecutable)) and
            not getattr(exe, "route", 0))
    put = session.arrays.put_fast if fast else session.arrays.put
    no_data = isinstance(exe, ProfileExecutable)
    for h, b, (shape, dtype), s, islands in zip(
        handles_, buffers, outputs, shardings, exe.output_islands):
      put(h, Array.failed(_NO_DATA) if no_data
          else Array(b, islands, dtype, shape, s), minted=first_call)
    # Nobody waits for a launch unless the client asked for its status:
    # readiness and errors travel through the output buffers' futures.
    on_done = None
    if status_future is not None:
      on_done = lambda status, *_: status_future.set_result(status)  # noqa: E731
    exe.launch(session.services, args, buffers, on_done)
    for i in exe.donated:
      if i < len(args):
        args[i].donate()  # the worker's launch consumes it
    if fast:
      _register_fast(session, req.loaded_executable_handle, exe, args, epoch)
  if status_future is not None:
    store = (session.execute_results
             if session.protocol_version >= _EXECUTE_RESULT_VERSION
             else session.futures)
    store.put(status_handle, status_future,
              minted=not req.result_status_handle)

  if not first_call and not fill_status:
    # The client reads nothing from later replies (it minted the handles
    # and cached the output specs); an empty body is enough.
    reply.ok()
    return

  def fill(r: Any) -> None:
    # The client checks status_handle == 0 unless it asked for a status.
    r.status_handle = status_handle if fill_status else 0
    for h, (shape, dtype), s in zip(handles_, outputs, shardings):
      o = r.outputs.add()
      dtypes.to_proto(dtype, o.dtype)
      o.shape.dims.extend(shape)
      sharding_lib.to_proto(session.slice.virtual_sharding(s), o.sharding)
      o.array_handle = h

  reply.ok(fill)


def _failure(session: Session, exe: Executable, args: list[Array]
             ) -> Status | None:
  """Why this call cannot launch (its outputs get the error), or None."""
  try:
    if isinstance(exe, CompiledProgram):
      # Its island's worker may be a new one (a lost island rejoined).
      exe.ensure_current(session.services)
    if exe.num_parameters is not None and len(args) != exe.num_parameters:
      raise invalid_argument(f"the program takes {exe.num_parameters} "
                             f"arguments, not {len(args)}")
    for i, a in enumerate(args):
      a.check_usable()
      exe.check_argument(i, a)
  except StatusError as e:
    return e.status
  return None


def _register_fast(session: Session, handle: int,
                   exe: CompiledProgram | MpmdExecutable, args: list[Array],
                   epoch: int) -> None:
  """Lets the fast path (controller/array_store.py) launch `exe` again on
  arguments laid out as these, which this call checked, as long as the
  islands do not change (`epoch`): the same schedule of ops, its buffers
  the next call's."""
  services = session.services
  if services.fast_path is None:
    return
  layouts = session.arrays.layouts
  outputs = [layouts.id(islands, dtype, shape, s) for islands, (shape, dtype), s
             in zip(exe.output_islands, exe.outputs, exe.output_shardings)]
  services.fast_path.register(
      session.stream, handle, epoch, [[layouts.of_array(a)] for a in args],
      outputs, [[i.id for i in islands] for islands in exe.output_islands],
      [layouts.plan(layout) for layout in outputs], list(exe.donated),
      exe.schedule(services, args).for_fast_path())


@handles("loaded_executable_fetch_execute_result_request")
def fetch_execute_result(session: Session, req: Any, reply: Reply) -> None:
  reply_when_done(session.execute_results.pop(req.result_status_handle),
                  reply)


def _answer_costs(reply: Reply, find: Callable[[], Any],
                  fill: Callable[[Any, Any], None]) -> None:
  """Cost analyses always answer with a body, an error inside it: an error
  reply without one makes the 0.10.2 client throw instead of raising."""
  try:
    exe = find()
  except StatusError as e:
    failure = e.status
    reply.ok(lambda r: (setattr(r.status, "code", int(failure.code)),
                        setattr(r.status, "message", failure.message)))
    return

  def body(r: Any) -> None:
    r.attributes.SetInParent()
    fill(exe, r.attributes)

  reply.ok(body)


def _float_attributes(out: Any, values: dict[str, float]) -> None:
  for k, v in values.items():
    out.attributes[k].float_value = float(v)


@handles("loaded_executable_cost_analysis_request")
def cost_analysis(session: Session, req: Any, reply: Reply) -> None:
  _answer_costs(
      reply, lambda: session.executables.get(req.loaded_executable_handle),
      lambda exe, out: _float_attributes(out, exe.metadata["cost_analysis"]))


@handles("loaded_executable_human_readable_program_text_request")
def human_readable_program_text(session: Session, req: Any,
                                reply: Reply) -> None:
  exe: Executable = session.executables.get(req.loaded_executable_handle)
  reply.ok(lambda r: setattr(r, "human_readable_program_text",
                             exe.metadata["hlo_text"]))


@handles("loaded_executable_delete_request")
def delete(session: Session, req: Any, reply: Reply) -> None:
  session.executables.discard(req.loaded_executable_handle)
  handle = new_done_future(session)
  reply.ok(lambda r: setattr(r, "future_handle", handle))


@handles("loaded_executable_is_deleted_request")
def is_deleted(session: Session, req: Any, reply: Reply) -> None:
  try:
    session.executables.get(req.loaded_executable_handle)
    deleted = False
  except StatusError:
    deleted = True
  reply.ok(lambda r: setattr(r, "is_deleted", deleted))


@handles("loaded_executable_destruct_request")
def destruct(session: Session, req: Any, reply: Reply) -> None:
  exe = session.executables.pop(req.loaded_executable_handle)
  if session.services.fast_path is not None:
    session.services.fast_path.unregister(session.stream,
                                          req.loaded_executable_handle)
  session.let_go(exe)
  reply.ok()


def _mpmd(session: Session, handle: int) -> MpmdExecutable:
  exe = session.executables.get(handle)
  if not isinstance(exe, MpmdExecutable):
    raise invalid_argument(f"executable {handle} is not an MPMD executable")
  return exe


@handles("loaded_executable_mpmd_metadata_request")
def mpmd_metadata(session: Session, req: Any, reply: Reply) -> None:
  exe = _mpmd(session, req.mpmd_loaded_executable_handle)

  def fill(r: Any) -> None:
    per_mesh = r.mpmd_compiled_memory_stats
    per_mesh.SetInParent()
    for mesh, stats in exe.mesh_memory_stats().items():
      entry = per_mesh.compiled_memory_stats[mesh]
      entry.SetInParent()
      for k, v in stats.items():
        setattr(entry, k, v)

  reply.ok(fill)


@handles("loaded_executable_mpmd_cost_analysis_request")
def mpmd_cost_analysis(session: Session, req: Any, reply: Reply) -> None:
  def fill(exe: MpmdExecutable, out: Any) -> None:
    for mesh, costs in exe.mesh_costs().items():
      out.attributes[mesh].SetInParent()
      _float_attributes(out.attributes[mesh], costs)

  _answer_costs(reply, lambda: _mpmd(session, req.loaded_executable_handle),
                fill)


@handles("loaded_host_callback_poll_request")
@handles("loaded_host_callback_return_request")
def host_callback(session: Session, req: Any, reply: Reply) -> None:
  raise unimplemented("host callbacks cannot cross the IFRT proxy")
