"""Compile: place the program on its islands, compile it there once.

An XlaProgram becomes one program on the islands of its devices; an
IfrtIRProgram (MPMD) one program per fragment, each on its mesh's islands;
pathwaysutils' PluginPrograms a ProfileExecutable (profiling) or a
PersistenceExecutable (saving and restoring arrays), and colocated_python's
CustomCallPrograms a ColocatedExecutable; none of these compiles anything.

The program is read by a reader process (programs/reader.py): the handler
hands it over and returns, and one of the controller's compile threads
waits for the reader, places the program and starts its compile, so the
sessions thread never waits on a client's program. The reply waits for the
worker's compile (the client waits for it anyway) and carries the
executable's handle; everything the client asks about the executable later
comes from the metadata the worker sent back.
"""
from __future__ import annotations

import base64
import dataclasses
from typing import Any

from absl import logging

from jax_pathways.controller import mpmd_executable
from jax_pathways.controller.colocated_executable import ColocatedExecutable
from jax_pathways.controller.handlers.executable import Executable
from jax_pathways.controller.handlers.future import new_done_future
from jax_pathways.controller.handlers.handler_table import handles
from jax_pathways.controller.mpmd_executable import MpmdExecutable
from jax_pathways.controller.persistence_executable import (
    PersistenceExecutable)
from jax_pathways.controller.profile_executable import ProfileExecutable
from jax_pathways.controller.session import Reply, Session
from jax_pathways.programs import (colocated_program, ifrt_ir_program,
                                   plugin_program, xla_program)
from jax_pathways.resources.topology import Topology
from jax_pathways.resources.virtual_slice import VirtualSlice
from jax_pathways.status import Code, Status, StatusError, unimplemented
from jax_pathways.storage.requests import PersistenceRequest


@handles("compile_request")
def compile_program(session: Session, req: Any, reply: Reply) -> None:
  if len(req.host_callbacks):
    raise unimplemented(
        "host callbacks sent in the IFRT proxy protocol are not served: "
        "jax_pathways' own client serves a program's callbacks from the "
        "user's process (import jax_pathways; jax_pathways.initialize())")
  services = session.services
  route = 0

  def compiled(status: Status, result: Executable | None) -> None:
    if not status.ok:
      if route:
        services.callbacks.release(route)
      reply.error(status)
      return
    handle = session.server_handles.new()
    session.executables.put(handle, result, minted=True)
    ready = new_done_future(session)

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

  devices = session.slice  # here: placing it may make the session wait

  def place_and_compile() -> None:
    nonlocal route
    try:
      if req.program.type_name == plugin_program.PLUGIN_PROGRAM:
        compiled(Status(), _plugin_executable(session.number, req, devices,
                                              services.topology))
        return
      if req.program.type_name == colocated_program.CUSTOM_CALL_PROGRAM:
        executable = ColocatedExecutable(
            colocated_program.parse(req.program, req.compile_options),
            devices, services.topology, session.number,
            session.client_packages)
        session.colocated_islands.update(executable.islands)
        compiled(Status(), executable)
        return
      if req.program.type_name == ifrt_ir_program.IFRT_IR_PROGRAM:
        mpmd_executable.compile_program(
            ifrt_ir_program.place(
                req.program, req.compile_options, services.topology,
                services.spmd_across_islands, devices,
                vet=services.programs and services.programs.vet_ifrt_ir),
            services.compile_cache, services.topology, compiled,
            session.number)
        return
      program = xla_program.place(
          req.program, req.compile_options, services.topology,
          services.spmd_across_islands, devices,
          serves_callbacks=(session.callbacks_client is not None and
                            services.callbacks is not None),
          read=services.programs and services.programs.read_xla)
      if program.callbacks.any:
        # Its callbacks run in this client's process alone (callback_router.py).
        route = services.callbacks.new_route(session.callbacks_client,
                                             program.callbacks.table,
                                             session.number)
        program = dataclasses.replace(program, route=route)
      services.compile_cache.compile(program, compiled, session.number)
    except StatusError as e:
      reply.error(e.status)
    except Exception as e:  # pylint: disable=broad-except
      logging.exception("client %d: compile failed", session.number)
      reply.error(Status(Code.INTERNAL,
                         f"jax_pathways controller: compile: {e!r}"))

  if services.compiles is None:
    place_and_compile()
  else:
    services.compiles.submit(place_and_compile)


def _plugin_executable(client: int, req: Any, devices: VirtualSlice,
                       topology: Topology
                       ) -> ProfileExecutable | PersistenceExecutable:
  """What a PluginProgram asks for, as an executable: nothing compiled."""
  request = plugin_program.parse(req.program, req.compile_options)
  if isinstance(request, PersistenceRequest):
    return PersistenceExecutable(request, devices, topology)
  islands = topology.islands_of(devices.physical_ids, "the client's slice")
  return ProfileExecutable(request, client, devices.physical_ids,
                           [i.id for i in islands])
