"""Futures: CheckFuture and CheckValueReady, answered when the work is done.

A future handle names a concurrent.futures.Future of a Status (compiles,
deletions, execution status before protocol 21); it is one-shot, as in the
reference server. CheckValueReady waits for arrays through the dispatcher's
buffer futures.
"""
from __future__ import annotations

import concurrent.futures
from typing import Any

from jax_pathways.controller.handlers.handler_table import handles
from jax_pathways.controller.session import Reply, Session
from jax_pathways.status import Status


def new_done_future(session: Session) -> int:
  """A new server handle naming a future that is already done, OK."""
  f: concurrent.futures.Future = concurrent.futures.Future()
  f.set_result(Status())
  handle = session.server_handles.new()
  session.futures.put(handle, f, minted=True)
  return handle


def reply_when_done(future: concurrent.futures.Future, reply: Reply) -> None:
  future.add_done_callback(lambda f: reply.status(f.result()))


@handles("check_future_request")
def check_future(session: Session, req: Any, reply: Reply) -> None:
  reply_when_done(session.futures.pop(req.future_handle), reply)


@handles("check_value_ready_request")
def check_value_ready(session: Session, req: Any, reply: Reply) -> None:
  buffers = []
  for h in req.value_handles:
    array = session.arrays.get(h)
    array.check_usable()
    buffers.append(array.buffer)
  session.services.dispatcher.when_ready(buffers, reply.status)
