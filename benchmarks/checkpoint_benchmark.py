"""Checkpoints of a sharded state: where the bytes go, and how long it takes.

    python benchmarks/checkpoint_benchmark.py [--size-mib 2048] [--islands 1 2 4]

A state of two float32 leaves (`--size-mib` in all), sharded over 8 CPU
devices, is saved and restored with orbax's CheckpointManager, each case in
a fresh child process (and a fresh cluster):

  default      jax_pathways, orbax as users write it (no Pathways handler):
               every shard is downloaded into the user's process and
               uploaded back
  persistence  jax_pathways, orbax's Pathways handler
               (CheckpointingImpl.PERSISTENCE): each island's worker writes
               and reads its own shards (storage/), for each --islands
               count (8 devices dealt among them)
  colocated    jax_pathways, orbax's Pathways handler with
               CheckpointingImpl.COLOCATED_PYTHON: each island's colocated
               Python process (the client's, beside the worker) writes and
               reads its own shards with tensorstore (OCDBT), for each
               --islands count
  plain        plain JAX and orbax in one process on 8 CPU devices

Per case: seconds to save (until the checkpoint is committed) and to
restore (until the arrays are ready), and the user's process's peak RSS
growth over the whole save and restore (VmHWM, reset before it, against
the RSS then). The restored state is checked against the saved one on the devices.
Prints one JSON line per case; ratios are to `plain` of the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
DEVICES = 8
# Modes saved through orbax's Pathways handler: its CheckpointingImpl.
_IMPLS = {"persistence": "PERSISTENCE", "colocated": "COLOCATED_PYTHON"}


def _status_bytes(field: str) -> int:
  with open("/proc/self/status", encoding="ascii") as f:
    line = next(l for l in f if l.startswith(field + ":"))
  return int(line.split()[1]) << 10


def _reset_peak() -> None:
  """Starts VmHWM (the peak RSS) anew from the RSS now (Linux >= 4.0)."""
  with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
    f.write("5")


def child(mode: str, islands: int, size_mib: int, path: str) -> None:
  """One case, in this process: prints {"save_s", "restore_s",
  "rss_growth_mib", "equal"}."""
  if mode == "plain":
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"
  else:
    if mode == "persistence":
      os.environ["ENABLE_PATHWAYS_PERSISTENCE"] = "1"
    import jax_pathways  # pylint: disable=import-outside-toplevel
    jax_pathways.initialize(islands=islands,
                            devices_per_island=DEVICES // islands)
  # pylint: disable=import-outside-toplevel
  import jax
  import jax.numpy as jnp
  import numpy as np
  import orbax.checkpoint as ocp
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
  if mode in _IMPLS:
    ocp.pathways.register_type_handlers(
        checkpointing_impl=ocp.pathways.CheckpointingImpl[_IMPLS[mode]])
  mesh = Mesh(np.array(jax.devices()[:DEVICES]), ("d",))
  n = (size_mib << 20) // 4 // 2
  make = jax.jit(lambda k: {"a": jax.random.normal(k, (n // 1024, 1024)),
                            "b": jax.random.uniform(k, (n // 1024, 1024))},
                 out_shardings=NamedSharding(mesh, P("d")))
  manager = ocp.CheckpointManager(
      path, item_handlers=ocp.PyTreeCheckpointHandler(
          use_ocdbt=mode != "persistence"))

  def save_and_restore(step: int, state: dict) -> tuple[float, float, dict]:
    start = time.perf_counter()
    manager.save(step, args=ocp.args.PyTreeSave(state))
    manager.wait_until_finished()
    saved = time.perf_counter()
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(
        a.shape, a.dtype, sharding=a.sharding), state)
    restored = manager.restore(step, args=ocp.args.PyTreeRestore(
        target, restore_args=ocp.checkpoint_utils.construct_restore_args(
            target)))
    jax.block_until_ready(restored)
    return saved - start, time.perf_counter() - saved, restored

  # Warmed up on a small state: imports, threads, compiles.
  small = jax.jit(lambda k: {"a": jax.random.normal(k, (DEVICES, 8)),
                             "b": jax.random.uniform(k, (DEVICES, 8))},
                  out_shardings=NamedSharding(mesh, P("d")))
  save_and_restore(1, small(jax.random.key(1)))
  state = jax.block_until_ready(make(jax.random.key(0)))
  _reset_peak()
  before = _status_bytes("VmRSS")
  save_s, restore_s, restored = save_and_restore(2, state)
  peak = _status_bytes("VmHWM")
  equal = jax.jit(lambda x, y: jnp.array_equal(x["a"], y["a"]) &
                  jnp.array_equal(x["b"], y["b"]))(state, restored)
  print(json.dumps({"save_s": save_s, "restore_s": restore_s,
                    "rss_growth_mib": max(0, peak - before) / (1 << 20),
                    "equal": bool(equal)}), flush=True)


def run_case(mode: str, islands: int, size_mib: int) -> dict:
  path = tempfile.mkdtemp(prefix=f"ckpt-{mode}-")
  try:
    out = subprocess.run(
        [sys.executable, HERE, "--child", mode, "--islands", str(islands),
         "--size-mib", str(size_mib), "--dir", path],
        capture_output=True, text=True, timeout=1800, check=False)
  finally:
    shutil.rmtree(path, ignore_errors=True)
  if out.returncode != 0:
    raise RuntimeError(f"{mode} x{islands} failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--size-mib", type=int, default=2048)
  parser.add_argument("--islands", type=int, nargs="+", default=[1, 2, 4])
  parser.add_argument("--child", default=None)
  parser.add_argument("--dir", default=None)
  args = parser.parse_args()
  if args.child:
    child(args.child, args.islands[0], args.size_mib, args.dir)
    return
  sys.path.insert(0, os.path.dirname(HERE))
  from harness import CONTEXT, emit, log  # pylint: disable=import-outside-toplevel
  CONTEXT["devices"] = DEVICES
  cases = [("plain", 1), ("default", 2)] + [
      (mode, k) for mode in _IMPLS for k in args.islands]
  results = {}
  for mode, islands in cases:
    got = results[(mode, islands)] = run_case(mode, islands, args.size_mib)
    log(f"{mode:12s} x{islands}: save {got['save_s']:7.2f} s  restore "
        f"{got['restore_s']:7.2f} s  client peak RSS +"
        f"{got['rss_growth_mib']:8.1f} MiB  equal={got['equal']}")
  plain = results[("plain", 1)]
  for (mode, islands), got in results.items():
    emit("checkpoint", f"{mode}_x{islands}", size_mib=args.size_mib,
         islands=islands, save_s=round(got["save_s"], 3),
         restore_s=round(got["restore_s"], 3),
         rss_growth_mib=round(got["rss_growth_mib"], 1), equal=got["equal"],
         save_vs_plain=round(got["save_s"] / plain["save_s"], 2),
         restore_vs_plain=round(got["restore_s"] / plain["restore_s"], 2))


if __name__ == "__main__":
  main()
