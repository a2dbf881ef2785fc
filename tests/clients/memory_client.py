"""A client of memory_test.py: keeps arrays on device 0 on command.

stdin lines: "put MB" (upload MB of float32 onto device 0 and wait for it),
"check" (every held array still has its values), "drop" (delete them all).
Prints one JSON line per command: {"ok": ...} or {"error": "..."}.
"""
import gc
import json
import sys

import jax_pathways

jax_pathways.initialize()

import jax  # noqa: E402
import numpy as np  # noqa: E402

held = []
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
  command, *arg = line.split()
  try:
    if command == "put":
      n = int(arg[0]) << 18  # float32s in MB
      held.append((len(held), jax.device_put(
          np.full(n, len(held), np.float32), jax.devices()[0])))
      held[-1][1].block_until_ready()
      reply = {"ok": len(held)}
    elif command == "check":
      reply = {"ok": all(float(np.asarray(a)[-1]) == k for k, a in held)}
    else:  # drop
      held.clear()
      gc.collect()
      reply = {"ok": 0}
  except Exception as e:  # pylint: disable=broad-except
    if command == "put":
      held.pop()
    reply = {"error": str(e)}
  print(json.dumps(reply), flush=True)
