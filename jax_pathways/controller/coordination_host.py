"""The process that holds the coordination services of the islands' global
client (controller/coordination.py), the controller's child.

Not the controller's own process: a worker in the global client runs
jaxlib's coordination agent, which aborts the worker (SIGABRT) as soon as
its service is unreachable, and jaxlib 0.10.2 gives no way to handle that
from Python. So the services go only after the workers have: once the
controller has stopped (its workers are told, and leave) or died (their
connection drops and their probe is refused), this process waits until no
agent is connected, for at most LINGER_S (a stopped worker's agent stays).

Commands, one JSON object a line on stdin: {"address": A, "islands": N}
starts a service for N workers at A and answers {"ready": A} or
{"error": why} on stdout; {"exit": true} (a clean stop) or stdin closing
(the controller died) ends it, once the agents have left.
"""
from __future__ import annotations

import json
import sys
import time

from jax_pathways.cluster import addresses

# A stopped or dead controller's workers leave within seconds (their
# connection drops at once, and their probe is refused).
LINGER_S = 10.0
_LINGER_POLL_S = 0.05
HEARTBEAT_TIMEOUT_S = 30


def _agents_connected() -> bool:
  """Whether a socket of this process has a peer: an agent's connection
  (the services' listeners have none)."""
  return next(addresses.connected_sockets(), None) is not None


def _linger() -> None:
  """Until no agent is connected, at most LINGER_S."""
  deadline = time.monotonic() + LINGER_S
  while _agents_connected() and time.monotonic() < deadline:
    time.sleep(_LINGER_POLL_S)


def main() -> None:
  from jaxlib import _jax  # pylint: disable=import-outside-toplevel
  services = []  # kept: a survivor's old agent still heartbeats to its own
  for line in sys.stdin:
    command = json.loads(line)
    if command.get("exit"):
      break
    try:
      services.append(_jax.get_distributed_runtime_service(
          command["address"], int(command["islands"]),
          heartbeat_timeout=HEARTBEAT_TIMEOUT_S, recoverable=True))
      answer = {"ready": command["address"]}
    except Exception as e:  # pylint: disable=broad-except
      answer = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(answer), flush=True)
  _linger()


if __name__ == "__main__":
  main()
