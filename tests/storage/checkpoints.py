"""Helpers of the storage tests that save and restore through orbax."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from typing import Iterator

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding
from orbax.checkpoint._src.serialization import type_handler_registry

import state

PLAIN = os.path.join(os.path.dirname(__file__), "plain_orbax.py")


def put(values: dict, mesh: Mesh, layout: str) -> dict:
  return {k: jax.device_put(v, NamedSharding(mesh, state.spec_of(v, layout)))
          for k, v in values.items()}


def plain(*args: str) -> dict:
  """plain_orbax.py ARGS, in a process of its own: its JSON answer."""
  out = subprocess.run([sys.executable, PLAIN, *args], capture_output=True,
                       text=True, timeout=240, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.splitlines()[-1])


def restore(path, mesh: Mesh) -> dict:
  """Step 1 of `path`, restored onto the other layout: whether each leaf
  has state.values()'s bits."""
  values = state.values()
  target = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(
      mesh, state.spec_of(v, "other"))) for k, v in values.items()}
  got = ocp.CheckpointManager(path).restore(1, args=ocp.args.PyTreeRestore(
      target, restore_args=ocp.checkpoint_utils.construct_restore_args(
          target)))
  return {k: np.asarray(got[k]).tobytes() == v.tobytes()
          for k, v in values.items()}


@contextlib.contextmanager
def pathways_handlers(impl: ocp.pathways.CheckpointingImpl) -> Iterator[None]:
  """orbax's Pathways handlers of `impl` while it lasts: the registry is
  process-wide, so the earlier handlers come back after."""
  registry = type_handler_registry.GLOBAL_TYPE_HANDLER_REGISTRY
  # pylint: disable=protected-access
  kept = list(registry._type_registry), dict(registry._typestr_registry)
  ocp.pathways.register_type_handlers(checkpointing_impl=impl)
  try:
    yield
  finally:
    registry._type_registry[:] = kept[0]
    registry._typestr_registry.clear()
    registry._typestr_registry.update(kept[1])


def capped(cluster, tmp_path, state_mib: int, headroom_mib: int,
           impl: str) -> dict:
  """limited_client.py's answer: a client of `cluster` whose address space
  is capped, once warmed up, `headroom_mib` above what it has (room for
  its threads' stacks), saves and restores a `state_mib` state with orbax's
  Pathways handlers of `impl`."""
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)
  env.update(JAX_PATHWAYS_ADDRESS=cluster.address,
             JAX_PATHWAYS_TOKEN=cluster.token,
             # glibc's per-thread arenas reserve 64 MiB each: counted by
             # the cap, mostly untouched.
             MALLOC_ARENA_MAX="2")
  script = os.path.join(os.path.dirname(__file__), "limited_client.py")
  # Threads' stacks of 2 MiB (`ulimit -s`; 8 by default): the cap counts
  # what they reserve, and the proxy client starts threads as it needs.
  out = subprocess.run(["bash", "-c", 'ulimit -s 2048 && exec "$@"', "bash",
                        sys.executable, script, str(tmp_path),
                        str(state_mib), str(headroom_mib), impl],
                       env=env, cwd="/", capture_output=True, text=True,
                       timeout=280, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.splitlines()[-1])
