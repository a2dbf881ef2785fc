"""The table of request handlers, filled by the handler modules."""
from __future__ import annotations

from typing import Any, Callable

from jax_pathways.controller.session import Handler

HANDLERS: dict[str, Handler] = {}
# For requests that create arrays: the client-minted result handles, which
# get the error if the request fails.
RESULT_HANDLES: dict[str, Callable[[Any], list[int]]] = {}


def handles(kind: str, results: Callable[[Any], list[int]] | None = None
            ) -> Callable[[Handler], Handler]:
  def register(fn: Handler) -> Handler:
    assert kind not in HANDLERS, kind
    HANDLERS[kind] = fn
    if results is not None:
      RESULT_HANDLES[kind] = results
    return fn
  return register
