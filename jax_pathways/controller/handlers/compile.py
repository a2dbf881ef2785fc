"""Compile: place the program on its islands, compile it there once.

An XlaProgram becomes one program on the islands of its devices; an
IfrtIRProgram (MPMD) one program per fragment, each on its mesh's islands;
pathwaysutils' profiling PluginProgram a ProfileExecutable, nothing compiled.

The reply waits for the worker's compile (the client waits for it anyway)
and carries the executable's handle; everything the client asks about the
executable later comes from the metadata the worker sent back.
"""
from __future__ import annotations

import base64
from typing import Any

from jax_pathways.controller import mpmd_executable
from jax_pathways.controller.compile_cache import CompiledProgram
from jax_pathways.controller.handlers.future import done_future
from jax_pathways.controller.handlers.registry import handles
from jax_pathways.controller.mpmd_executable import MpmdExecutable
from jax_pathways.controller.profile_executable import ProfileExecutable
from jax_pathways.controller.session import Reply, Session
from jax_pathways.programs import ifrt_ir_program, plugin_program, xla_program
from jax_pathways.status import Status, unimplemented

Loaded = CompiledProgram | MpmdExecutable | ProfileExecutable


@handles("compile_request")
def compile_program(session: Session, req: Any, reply: Reply) -> None:
  if len(req.host_callbacks):
    raise unimplemented(
        "host callbacks (jax.debug.print, pure_callback, io_callback) cannot "
        "cross the IFRT proxy; see docs/limitations.md")
  services = session.services

  def compiled(status: Status, result: Loaded | None) -> None:
    if not status.ok:
      reply.error(status)
      return
    handle = session.server_handles.new()
    session.executables.put(handle, result)
    ready = session.server_handles.new()
    session.futures.put(ready, done_future())

    def fill(r: Any) -> None:
      r.loaded_executable_handle = handle
      r.name = result.metadata.get("name", "jax_pathways_program")
      devices = session.slice.virtual(result.devices)
      r.num_devices = len(devices)
      r.device_ids.extend(devices)
      r.addressable_device_ids.extend(devices)
      fingerprint = result.metadata.get("fingerprint")
      if fingerprint:
        r.fingerprint_value = base64.b64decode(fingerprint)
      r.ready_future_handle = ready
      if isinstance(result, MpmdExecutable):
        # Its presence makes the client build an MPMD executable.
        by_mesh = r.mpmd_addressable_devices
        by_mesh.SetInParent()
        for mesh, on in result.program.meshes.items():
          by_mesh.mpmd_addressable_devices[mesh].mpmd_addressable_device_ids \
              .extend(session.slice.virtual(on))

    reply.ok(fill)

  if req.program.type_name == plugin_program.PLUGIN_PROGRAM:
    request = plugin_program.parse(req.program, req.compile_options)
    devices = session.slice.physical_ids
    islands = services.topology.islands_of(devices, "the client's slice")
    compiled(Status(), ProfileExecutable(request, session.number, devices,
                                          [i.id for i in islands]))
    return
  mpmd = req.program.type_name == ifrt_ir_program.IFRT_IR_PROGRAM
  program = (ifrt_ir_program if mpmd else xla_program).place(
      req.program, req.compile_options, services.topology,
      services.spmd_across_islands, session.slice)
  if mpmd:
    mpmd_executable.compile_program(program, services.compile_cache,
                                    services.topology, compiled)
  else:
    services.compile_cache.compile(program, compiled)
