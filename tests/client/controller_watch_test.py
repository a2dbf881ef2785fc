"""The watch's cut: exactly the sockets connected to the controller's
address are shut down, by TCP address or Unix path; a silent controller is
given up on (an answering one is not: every integration test)."""
import socket

import pytest

from jax_pathways.client import controller_watch


def _pair(family, address):
  listener = socket.socket(family, socket.SOCK_STREAM)
  listener.bind(address)
  listener.listen(4)
  client = socket.socket(family, socket.SOCK_STREAM)
  client.connect(listener.getsockname())
  server, _ = listener.accept()
  return listener, client, server


@pytest.mark.parametrize("family", ["tcp", "unix"])
def test_only_connections_to_the_target_are_shut_down(family, tmp_path):
  if family == "tcp":
    listener, ours, theirs = _pair(socket.AF_INET, ("127.0.0.1", 0))
    other, bystander, far = _pair(socket.AF_INET, ("127.0.0.1", 0))
    target = "grpc://127.0.0.1:%d" % listener.getsockname()[1]
  else:
    path = str(tmp_path / "c.sock")
    listener, ours, theirs = _pair(socket.AF_UNIX, path)
    other, bystander, far = _pair(socket.AF_UNIX, str(tmp_path / "o.sock"))
    target = "grpc://unix:" + path
  try:
    assert controller_watch.shut_down_connections(target) == 1
    theirs.settimeout(10)
    assert theirs.recv(1) == b""  # the peer sees the end
    bystander.sendall(b"x")  # the other connection still works
    far.settimeout(10)
    assert far.recv(1) == b"x"
  finally:
    for s in (listener, ours, theirs, other, bystander, far):
      s.close()


def test_a_silent_controller_is_given_up_on(tmp_path):
  # A Unix socket that accepts nothing: gRPC never gets its SETTINGS frame.
  path = str(tmp_path / "silent.sock")
  silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  silent.bind(path)
  silent.listen(1)
  watch = controller_watch.ControllerWatch("grpc://unix:" + path, 2.0)
  watch.start()
  try:
    assert watch.gave_up.wait(60), "a silent controller was never given up on"
  finally:
    watch.stop()
    silent.close()
