"""Executor: one client's colocated process beside one island's devices.

    python -m jax_pathways.colocated.executor FD

The worker starts it (worker/colocated_processes.py) with one end of a
socket pair as FD, and says first which devices the client has and which of
them are this island's; from then on each frame asks to call a function
(its pickle comes with its first call here) on this island's shards of its
inputs, and is answered with this island's shards of its outputs, or with
the error the function raised. The process holds the functions it was sent
until told to drop them; it ends when the connection does or when the
worker dies, and with it everything the user's code made here.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
from typing import Any

# Before jax is imported: this process's JAX is a CPU job of its own, not
# a client of the cluster, and not the worker's emulated devices.
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.pop("XLA_FLAGS", None)

import jax  # pylint: disable=wrong-import-position
from jax._src import tree_util  # pylint: disable=wrong-import-position
from jax.experimental.colocated_python import serialization  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

from jax_pathways.colocated import frames, packages  # pylint: disable=wrong-import-position
from jax_pathways.colocated.device_view import DeviceView  # pylint: disable=wrong-import-position

# A call's frame carries its inputs' shards: as large as the island holds.
MAX_FRAME_BYTES = 1 << 46
_MAX_ERROR_CHARS = 8192
_PARENT_POLL_S = 1.0


def _format(e: BaseException) -> str:
  text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
  return text[-_MAX_ERROR_CHARS:]


class Executor:
  """The functions this process holds, and how a call runs."""

  def __init__(self, view: DeviceView):
    self._view = view
    self._functions: dict[str, tuple[Any, ...]] = {}

  def serve(self, sock: socket.socket) -> None:
    while True:
      header, blobs = frames.recv(sock, MAX_FRAME_BYTES)
      try:
        if header["op"] == "drop":
          self._functions.pop(header["function"], None)
          frames.send(sock, {})
        else:
          frames.send(sock, *self._call(header, blobs))
      except frames.Closed:
        raise
      except BaseException as e:  # pylint: disable=broad-except
        frames.send(sock, {"error": _format(e)})

  def _call(self, header: dict[str, Any], blobs: list[memoryview]
            ) -> tuple[Any, ...]:
    key = header["function"]
    # The pickle comes first when sent (again, after a call that failed).
    n = 1 if header.get("pickled") else 0
    entry = self._functions.get(key)
    if entry is None:
      if not n:
        raise RuntimeError(f"function {key} was not sent to this process")
      entry = self._functions[key] = serialization._deserialize(  # pylint: disable=protected-access
          bytes(blobs[0]))
    fun, in_treedef, in_specs, _, out_specs, _ = entry
    args = []
    for spec, item in zip(in_specs, header["inputs"]):
      shards = []
      for client_id, shape, kind in item:
        data = (frames.strings_shard(blobs[n], shape) if kind == "string" else
                np.frombuffer(blobs[n], dtype=spec.dtype).reshape(shape))
        n += 1
        shards.append(jax.device_put(data, self._view.by_client_id[client_id]))
      args.append(jax.make_array_from_single_device_arrays(
          spec.shape, spec.sharding, shards))
    args, kwargs = tree_util.tree_unflatten(in_treedef, args)
    leaves = tree_util.tree_leaves(fun(*args, **kwargs))
    if len(leaves) != len(out_specs):
      raise ValueError(f"the function returned {len(leaves)} arrays; its "
                       f"output specs name {len(out_specs)}")
    described, out = [], []
    for j, (leaf, spec, wanted) in enumerate(
        zip(leaves, out_specs, header["outputs"])):
      if not isinstance(leaf, jax.Array) or leaf.shape != spec.shape or (
          leaf.dtype != spec.dtype):
        got = (f"{leaf.dtype}{list(leaf.shape)}" if isinstance(leaf, jax.Array)
               else type(leaf).__name__)
        raise ValueError(f"output {j} is {got}; its spec is "
                         f"{spec.dtype}{list(spec.shape)}")
      held = {s.device.id: s.data for s in leaf.addressable_shards}
      shards = []
      for client_id in wanted:
        data = held.get(self._view.by_client_id[client_id].id)
        if data is None:
          raise ValueError(f"output {j} has no shard on device {client_id} "
                           f"(it is on {leaf.sharding})")
        host = np.asarray(data)
        if host.dtype.kind == "T":  # StringDType
          out.append(frames.strings(host))
          shards.append({"shape": list(host.shape), "dtype": "string"})
        else:
          out.append(frames.raw(host))
          shards.append({"shape": list(host.shape), "dtype": host.dtype.name})
      described.append(shards)
    return ({"outputs": described}, *out)


def _watch_parent() -> None:
  parent = os.getppid()
  while True:
    time.sleep(_PARENT_POLL_S)
    if os.getppid() != parent:
      os._exit(1)  # the worker is gone: so is everything it held here


def main(argv: list[str]) -> None:
  sock = socket.socket(fileno=int(argv[1]))
  threading.Thread(target=_watch_parent, name="jp-parent", daemon=True).start()
  try:
    hello, _ = frames.recv(sock, 1 << 30)
    ours = packages.describe()
    why = packages.mismatch(hello.get("client_packages"), ours)
    if why:
      frames.send(sock, {"error": why})
      return
    view = DeviceView(hello["node"], hello["counts"],
                      [tuple(d) for d in hello["devices"]])
    view.install()
    frames.send(sock, {"packages": ours, "pid": os.getpid()})
    Executor(view).serve(sock)
  except frames.Closed:
    pass
  except BaseException as e:  # pylint: disable=broad-except
    try:
      frames.send(sock, {"error": _format(e)})
    except OSError:
      pass
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    # No destructors: the view's coordination agents abort a process whose
    # peers leave first.
    os._exit(0)


if __name__ == "__main__":
  main(sys.argv)
