"""Keeps two messages of jaxlib's IFRT-proxy client off stderr, nothing else.

jaxlib's client logs both at WARNING, and neither can be avoided at its
source:

* "credentials": "IFRT proxy using insecure client credentials because of
  environment variable." (xla/python/ifrt_proxy/common/
  grpc_credentials_possibly_insecure_wrapper.cc), once per gRPC channel the
  client makes while connecting. IFRT_PROXY_USE_INSECURE_GRPC_CREDENTIALS
  =true is the only way to plaintext, and the only other credentials are
  ALTS, which need Google Cloud's handshaker. The controller speaks
  plaintext and checks the cluster token of every session
  (docs/security.md).
* "session_end": "IFRT proxy server disconnected: CANCELLED: CANCELLED;
  Stack trace: ..." (xla/python/ifrt_proxy/client/grpc_client.cc), when the
  client is destroyed (at exit, or in shutdown()): it ends its session by
  cancelling its own stream, and logs every end of a session that had
  started. A session the controller ends first is cancelled and logged
  alike (grpc_client_session.cc: Finish() calls TryCancel() regardless).

Each is dropped only while a Dropping for it is open: around the connect,
and from exit (or around shutdown()'s teardown) on. A controller that dies
while the program runs is reported unfiltered (UNAVAILABLE: Socket closed).

While a Dropping is open, fd 2 feeds a child process that copies every line
to the real stderr except those of the one message it was told to drop. A
child, not a thread: the session ends while the interpreter finalizes, when
no Python thread runs; the child drains the pipe after this process exits.
Run as a script, this file is that child (stdlib only: it starts with -I -S).
"""
from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
from typing import BinaryIO, Callable

_LOG = rb"W\d{4} [\d:.]+ +\d+ "
MESSAGES = {
    "credentials": _LOG + rb"grpc_credentials_possibly_insecure_wrapper\.cc:"
                   rb"\d+\] IFRT proxy using insecure client credentials "
                   rb"because of environment variable\.\n",
    # Group 1: a stack trace follows, up to END_OF_TRACE and a blank line.
    "session_end": _LOG + rb"grpc_client\.cc:\d+\] IFRT proxy server "
                   rb"disconnected: CANCELLED: (?:CANCELLED|Cancelled)"
                   rb"(; Stack trace: \*\*\* Begin stack trace \*\*\*)?\n",
}
END_OF_TRACE = b"*** End stack trace ***\n"
_CLOSE_TIMEOUT_S = 5.0


def copy_without(message: str, src: BinaryIO, dst: BinaryIO,
                 dropped: Callable[[], None] = lambda: None) -> None:
  """Copies src to dst line by line, leaving out `message` (a MESSAGES
  key) with its stack trace; calls `dropped` after each one left out. A
  trace cut short is not the message's known shape: what was held back is
  written."""
  regex = re.compile(MESSAGES[message])
  held: list[bytes] = []  # a dropped message's stack trace so far
  after_trace = False
  for line in src:
    if held:
      held.append(line)
      if line == END_OF_TRACE:
        held, after_trace = [], True
        dropped()
      continue
    if after_trace:
      after_trace = False
      if line == b"\n":
        continue
    match = regex.fullmatch(line)
    if match:
      if match.lastindex:  # a stack trace follows
        held = [line]
      else:
        dropped()
      continue
    dst.write(line)
    dst.flush()
  dst.writelines(held)
  dst.flush()


class Dropping:
  """fd 2 runs through a filter child that drops `message` until close()
  (or, if never closed, until this process and its children let go)."""

  def __init__(self, message: str):
    if message not in MESSAGES:
      raise ValueError(f"unknown message {message!r}")
    self._child: subprocess.Popen | None = None
    sys.stderr.flush()
    try:
      self._saved = os.dup(2)
    except OSError:  # no stderr: nothing to keep clean
      return
    try:
      # Its stdout says "dropped one" (a line each): wait_until_dropped.
      self._child = subprocess.Popen(
          [sys.executable, "-I", "-S", os.path.abspath(__file__), message],
          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    except OSError as e:  # noise is better than losing what follows
      os.close(self._saved)
      # Not at the top: the child runs with -I -S, where absl is not found.
      from absl import logging  # pylint: disable=import-outside-toplevel
      logging.vlog(1, "stderr filter not started: %s", e)
      return
    os.dup2(self._child.stdin.fileno(), 2)
    self._child.stdin.close()  # fd 2 is now the pipe's only writer here

  def wait_until_dropped(self, timeout_s: float) -> bool:
    """Whether the message has been left out once, waiting up to timeout_s
    for it (for a message that comes from another thread, later)."""
    if self._child is None:
      return False
    ready, _, _ = select.select([self._child.stdout], [], [], timeout_s)
    return bool(ready) and bool(self._child.stdout.readline())

  def close(self) -> None:
    """Gives fd 2 back and waits (bounded) for the child to write out what
    it has; a process that inherited the pipe keeps it going."""
    child, self._child = self._child, None
    if child is None:
      return
    sys.stderr.flush()
    os.dup2(self._saved, 2)
    os.close(self._saved)
    with contextlib.suppress(subprocess.TimeoutExpired):
      child.wait(timeout=_CLOSE_TIMEOUT_S)
    child.stdout.close()

  def __enter__(self) -> Dropping:
    return self

  def __exit__(self, *_: object) -> None:
    self.close()


def _main() -> None:
  # Ctrl-C reaches the whole process group: the filter outlives the
  # interrupted program to pass on its last words.
  signal.signal(signal.SIGINT, signal.SIG_IGN)

  def dropped() -> None:
    # Nobody may wait for it (after close(), or at exit). Unbuffered:
    # nothing left to flush at exit, when nobody reads.
    with contextlib.suppress(OSError):
      os.write(sys.stdout.fileno(), b"dropped\n")

  with contextlib.suppress(BrokenPipeError):  # nobody reads stderr any more
    copy_without(sys.argv[1], sys.stdin.buffer, sys.stderr.buffer, dropped)


if __name__ == "__main__":
  _main()
