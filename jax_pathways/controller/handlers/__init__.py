"""Request handlers, one module per IFRT noun; importing registers them."""
from jax_pathways.controller.handlers import array
from jax_pathways.controller.handlers import client
from jax_pathways.controller.handlers import compile  # pylint: disable=redefined-builtin
from jax_pathways.controller.handlers import executable
from jax_pathways.controller.handlers import future
from jax_pathways.controller.handlers.handler_table import (HANDLERS,
                                                           RESULT_HANDLES)

__all__ = ["HANDLERS", "RESULT_HANDLES"]

del array, client, compile, executable, future
