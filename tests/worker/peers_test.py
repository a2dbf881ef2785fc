"""A worker's peer links across a peer's loss: which moves the loss covers
(the ops numbered before it), and a handshake with a stopped peer (its
kernel accepts the connection, nothing answers) ends when it is lost."""
import socket
import threading
import time

from jax_pathways.worker.peers import Peers


def test_a_loss_covers_the_ops_numbered_before_it():
  peers = Peers("token", "127.0.0.1:0")
  try:
    assert peers.loss(1, 1) is None
    peers.lost(1, 5, "w1 is lost")
    assert peers.loss(1, 5) == "w1 is lost"
    assert peers.loss(1, 6) is None  # numbered for its replacement
    peers.lost(1, 9, "w1' is lost")  # the replacement is lost too
    assert peers.loss(1, 3) == "w1 is lost"
    assert peers.loss(1, 7) == "w1' is lost"
    assert peers.loss(1, 10) is None
    assert peers.loss(2, 1) is None
  finally:
    peers.close()


def test_a_handshake_with_a_stopped_peer_ends_when_it_is_lost():
  stopped = socket.create_server(("127.0.0.1", 0))  # never accepts
  peers = Peers("token", "127.0.0.1:0")
  failed = []

  def connect():
    try:
      peers.outgoing(1, "127.0.0.1:%d" % stopped.getsockname()[1], 30.0)
    except Exception as e:  # pylint: disable=broad-except
      failed.append(e)

  try:
    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive()  # in the handshake
    began = time.monotonic()
    peers.lost(1, 3, "w1 is lost")
    thread.join(10)
    assert not thread.is_alive() and failed, failed
    assert time.monotonic() - began < 5  # not the handshake's 30 s
  finally:
    peers.close()
    stopped.close()
