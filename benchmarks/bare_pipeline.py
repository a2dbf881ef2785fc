"""The bubble floor of this machine: a pipeline's fragments with no runtime.

    idle, launch_s = measure(step.ifrt_ir, islands=2, steps=3)

Runs a partitioned pipeline step (its IFRT IR program) the barest way this
machine allows: one process per island, its device computing on the core
B4 gives that island's worker (island i on core i % 2; the process's other
threads run on either core, as a worker's do), each compiling its island's fragments exactly as
a worker does (worker.pjrt_backend) and enqueueing them in schedule order.
A fragment that needs a value from another island is enqueued once a 4-byte
token has come on a pipe from the process that made it (a thread waits for
each launch in turn and sends the tokens); the bytes themselves are not
moved (each fragment gets inputs of the right shapes, made before the
step). No controller, no client, no transfers, no tracing:
what is left is the schedule, the fragments' own times, and the two cores
they share. Each island's idle fraction is measured as B4 measures it,
1 - (its time in launches) / (first launch start to last launch end), so
B4's measured idle minus this floor is the runtime's whole share.

Run as a script, it is one island's process (measure() starts them).
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import select
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from jax_pathways.cluster import cores

_TOKEN = struct.Struct("<i")
_TIMEOUT_S = 600.0


def measure(ifrt_ir: str, islands: int, steps: int, pin: bool = True,
            warmup: int = 1
            ) -> tuple[dict[int, list[float]], dict[int, list[list[float]]]]:
  """Per island, its idle fraction in each of `steps` bare steps, and its
  launch times (seconds, in its schedule order) in each."""
  dealt = cores.deal(islands, cores.available())
  with tempfile.NamedTemporaryFile("w", suffix=".mlir") as program:
    program.write(ifrt_ir)
    program.flush()
    inboxes = [os.pipe() for _ in range(islands)]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # one CPU device, as a worker of one
    procs = []
    try:
      for i in range(islands):
        outboxes = ",".join(f"{j}:{inboxes[j][1]}" for j in range(islands)
                            if j != i)
        command = [sys.executable, os.path.abspath(__file__),
                   "--program", program.name, "--island", str(i),
                   "--islands", str(islands), "--inbox", str(inboxes[i][0]),
                   "--outboxes", outboxes]
        if pin:
          command += ["--cores", cores.format_list(dealt[i])]
        procs.append(subprocess.Popen(
            command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, pass_fds=[fd for pair in inboxes for fd in pair]))
      for i, p in enumerate(procs):
        if _line(p, i) != "ready":
          raise RuntimeError(f"bare island {i} did not start")
      idle: dict[int, list[float]] = {i: [] for i in range(islands)}
      launch_s: dict[int, list[list[float]]] = {i: [] for i in range(islands)}
      for k in range(warmup + steps):
        for p in procs:
          p.stdin.write("go\n")
          p.stdin.flush()
        launches = [json.loads(_line(p, i)) for i, p in enumerate(procs)]
        if k < warmup:
          continue
        start = min(t0 for island in launches for t0, _ in island)
        end = max(t1 for island in launches for _, t1 in island)
        for i, island in enumerate(launches):
          busy = sum(t1 - t0 for t0, t1 in island)
          idle[i].append(1.0 - busy / (end - start))
          launch_s[i].append([(t1 - t0) / 1e9 for t0, t1 in island])
      return idle, launch_s
    finally:
      for p in procs:
        p.kill()
        p.wait(timeout=30)
      for r, w in inboxes:
        os.close(r)
        os.close(w)


def _line(proc: subprocess.Popen, island: int) -> str:
  ready, _, _ = select.select([proc.stdout], [], [], _TIMEOUT_S)
  line = proc.stdout.readline() if ready else ""
  if not line:
    raise RuntimeError(f"bare island {island} stopped or hung "
                       f"(exit code {proc.poll()})")
  return line.strip()


def _island_main(args: argparse.Namespace) -> None:
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel

  from jax_pathways.programs import ifrt_ir_program  # pylint: disable=import-outside-toplevel
  from jax_pathways.resources.topology import Topology  # pylint: disable=import-outside-toplevel
  from jax_pathways.worker.pjrt_backend import PjrtBackend, np_dtype  # pylint: disable=import-outside-toplevel

  topology = Topology(args.islands)
  for i in range(args.islands):
    topology.register({"island": i, "num_devices": 1})
  with open(args.program) as f:
    text = f.read()
  program = ifrt_ir_program._Reader(  # pylint: disable=protected-access
      topology, False, list(range(args.islands)), {}).read(text)

  def island_of(fragment: int) -> int:
    return program.fragments[fragment].islands[0].id

  made_by: dict[int, int] = {}     # value -> index of the call making it
  copied_from: dict[int, int] = {}  # value -> the value it copies
  calls = []
  for step in program.steps:
    if isinstance(step, ifrt_ir_program.Call):
      made_by.update({v: len(calls) for v in step.results})
      calls.append(step)
    else:
      copied_from.update(zip(step.results, step.args))
  with cores.pinned(cores.parse(args.cores) if args.cores else None):
    backend = PjrtBackend(1)
  device = backend.device(0)
  compiled = {}
  mine, waits, tell = [], {}, {}
  for index, call in enumerate(calls):
    for v in call.args:
      source = made_by.get(copied_from.get(v, -1))
      if source is not None and island_of(calls[source].fragment) != \
          island_of(call.fragment):
        waits.setdefault(index, set()).add(source)
        tell.setdefault(source, set()).add(island_of(call.fragment))
    if island_of(call.fragment) == args.island:
      placed = program.fragments[call.fragment]
      if call.fragment not in compiled:
        compiled[call.fragment] = backend.compile(
            placed.program, placed.options, [0], placed.replicas)
      mine.append(index)
  outboxes = {int(j): int(fd) for j, fd in
              (pair.split(":") for pair in args.outboxes.split(",") if pair)}
  rng = np.random.default_rng(args.island)

  def value(v: int) -> Any:
    t = program.values[v]
    host = (rng.standard_normal(t.shape) * 0.1).astype(np_dtype(t.dtype))
    return jax.device_put(host, device)

  shared = {v: value(v) for v in program.inputs}

  def inputs(index: int) -> list[Any]:
    call = calls[index]
    donated = set(compiled[call.fragment].metadata["donated_input_indices"])
    return [shared[v] if v in shared and k not in donated else value(v)
            for k, v in enumerate(call.args)]

  def finish(launched: queue.Queue, ends: list[int]) -> None:
    """Waits for each launch in turn; tells the islands that need it."""
    for index, (_, execution) in iter(launched.get, None):
      execution.block_until_ready()
      ends.append(time.monotonic_ns())
      for island in tell.get(index, ()):
        os.write(outboxes[island], _TOKEN.pack(index))

  print("ready", flush=True)
  for _ in sys.stdin:
    prepared = {index: inputs(index) for index in mine}
    jax.block_until_ready(prepared)
    arrived: set[int] = set()
    launched: queue.Queue = queue.Queue()
    issued, ends = [], []
    waiter = threading.Thread(target=finish, args=(launched, ends))
    waiter.start()
    for index in mine:
      while not waits.get(index, set()) <= arrived:
        data = os.read(args.inbox, _TOKEN.size * 64)
        arrived.update(t for (t,) in _TOKEN.iter_unpack(data))
      # Enqueued as soon as its inputs exist, behind the launch before it
      # (PJRT runs it when that one is done), as a worker enqueues.
      issued.append(time.monotonic_ns())
      launched.put((index, backend.execute(compiled[calls[index].fragment],
                                           prepared.pop(index))))
    launched.put(None)
    waiter.join()
    # A launch starts when the one before it ends, or when it was issued.
    starts = [max(t, e) for t, e in zip(issued, [0] + ends[:-1])]
    print(json.dumps(list(zip(starts, ends))), flush=True)


if __name__ == "__main__":
  parser = argparse.ArgumentParser()
  parser.add_argument("--program", required=True)
  parser.add_argument("--island", type=int, required=True)
  parser.add_argument("--islands", type=int, required=True)
  parser.add_argument("--inbox", type=int, required=True)
  parser.add_argument("--outboxes", default="")
  parser.add_argument("--cores", default=None)
  _island_main(parser.parse_args())
