"""The process that holds the coordination services of the islands' global
client (controller/coordination.py), the controller's child.

Not the controller's own process: a worker in the global client runs
jaxlib's coordination agent, which aborts the worker (SIGABRT) as soon as
its service is unreachable, and jaxlib 0.10.2 gives no way to handle that
from Python. Were the services in the controller, a controller that dies
would take them down at the very moment the workers' own exit path starts
(their connection closes, their probe is refused: exit 0), and the agents
won the race. Here the services outlive a dead controller by LINGER_S,
time for its workers to leave on their own.

Commands, one JSON object a line on stdin: {"address": A, "islands": N}
starts a service for N workers at A and answers {"ready": A} or
{"error": why} on stdout; {"exit": true} ends the process at once (a clean
stop). stdin closing without it means the controller died.
"""
from __future__ import annotations

import json
import sys
import time

# A dead controller's workers leave within seconds (their connection drops
# at once, and their probe is refused).
LINGER_S = 10.0
HEARTBEAT_TIMEOUT_S = 30


def main() -> None:
  from jaxlib import _jax  # pylint: disable=import-outside-toplevel
  services = []  # kept: a survivor's old agent still heartbeats to its own
  for line in sys.stdin:
    command = json.loads(line)
    if command.get("exit"):
      return
    try:
      services.append(_jax.get_distributed_runtime_service(
          command["address"], int(command["islands"]),
          heartbeat_timeout=HEARTBEAT_TIMEOUT_S, recoverable=True))
      answer = {"ready": command["address"]}
    except Exception as e:  # pylint: disable=broad-except
      answer = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(answer), flush=True)
  time.sleep(LINGER_S)


if __name__ == "__main__":
  main()
