"""Calls of programs with host callbacks, as plain JAX makes them on CPU.

jaxlib's CPU client runs a program that has host callbacks on the calling
thread when it has one device (xla/python/pjrt_ifrt: such programs execute
kSynchronous; XLA:CPU runs one-device programs inline): the call returns
once its callbacks ran, and a callback's exception is raised by the call.
jaxlib's proxy client returns at once and the error comes with the
results. Code written against CPU JAX reads a callback's effects right
after the call, or catches its error around it (equinox's error_if, debug
prints read back), so here such a call waits for its execution's status,
which JAX reads right after executing (ExecuteReplicated consumes the
token): the same rule, on islands of CPU devices. Programs without
callbacks, and programs of several devices, keep dispatching ahead.

JAX's C++ dispatch would call such an executable itself on later calls
(a pure_callback has no effects, so JAX gives it the fast path), past the
wait: install() keeps those calls in Python.
"""
from __future__ import annotations

import functools
from typing import Any


def install() -> None:
  """No C++ fast path for waited executables (documented in
  docs/limitations.md with the other patches)."""
  from jax._src import pjit  # pylint: disable=import-outside-toplevel
  fastpath_data = pjit._get_fastpath_data  # pylint: disable=protected-access
  if getattr(fastpath_data, "_jax_pathways", False):
    return

  @functools.wraps(fastpath_data)
  def unless_waited(executable: Any, *args: Any, **kwargs: Any) -> Any:
    call = getattr(executable, "unsafe_call", None)
    if isinstance(getattr(call, "xla_executable", None), _Synchronous):
      return None
    return fastpath_data(executable, *args, **kwargs)

  unless_waited._jax_pathways = True  # type: ignore[attr-defined]
  pjit._get_fastpath_data = unless_waited  # pylint: disable=protected-access


def wrap(executable: Any, devices: Any) -> Any:
  """`executable` (a LoadedExecutable of a program with host callbacks on
  `devices`), waited for at each call where plain JAX on CPU would."""
  if len(devices) != 1 or devices[0].platform != "cpu":
    return executable
  return _Synchronous(executable)


class _Synchronous:
  """A LoadedExecutable whose executions are waited for (all else is the
  executable's own)."""

  def __init__(self, executable: Any):
    self._executable = executable

  def execute_sharded(self, arguments: Any, with_tokens: bool = False
                      ) -> Any:
    results = self._executable.execute_sharded(arguments,
                                               with_tokens=with_tokens)
    return _Waited(results) if with_tokens else results

  def __getattr__(self, name: str) -> Any:
    return getattr(self._executable, name)


class _Waited:
  """ExecuteResults whose token, once JAX takes it, is the finished
  execution's: taking it raises the execution's error."""

  def __init__(self, results: Any):
    self._results = results

  def consume_token(self) -> Any:
    token = self._results.consume_token()
    token.block_until_ready()
    return token

  def __getattr__(self, name: str) -> Any:
    return getattr(self._results, name)
