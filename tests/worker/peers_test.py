"""A worker's peer links across a peer's loss: which moves the loss covers
(the ops numbered before it), and a connect to a dead host (nothing
answers it) or a handshake with a stopped peer (its kernel accepts the
connection, nothing answers) ends when the peer is lost."""
import socket
import threading

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


def _ends_when_lost(address: str) -> None:
  """peers.outgoing(address) still waits after 0.5 s, and fails on the
  peer's loss (not after its 30 s timeout)."""
  peers = Peers("token", "127.0.0.1:0")
  failed = []

  def connect():
    try:
      peers.outgoing(1, address, 30.0)
    except Exception as e:  # pylint: disable=broad-except
      failed.append(e)

  try:
    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive()
    peers.lost(1, 3, "w1 is lost")
    thread.join(10)  # its own timeout is 30 s
    assert not thread.is_alive() and failed, failed
  finally:
    peers.close()


def test_a_handshake_with_a_stopped_peer_ends_when_it_is_lost():
  stopped = socket.create_server(("127.0.0.1", 0))  # never accepts
  try:
    _ends_when_lost("127.0.0.1:%d" % stopped.getsockname()[1])
  finally:
    stopped.close()


def test_a_connect_to_a_dead_host_ends_when_it_is_lost():
  # A listener whose accept queue is full drops new SYNs, as a dead host
  # does: a connect to it waits, retrying, until its timeout.
  dead = socket.socket()
  dead.bind(("127.0.0.1", 0))
  dead.listen(0)
  queued = []
  try:
    for _ in range(8):
      s = socket.socket()
      s.settimeout(0.5)
      try:
        s.connect(dead.getsockname())
      except OSError:
        s.close()
        break
      queued.append(s)
    else:
      raise AssertionError("the listener never stopped answering")
    _ends_when_lost("127.0.0.1:%d" % dead.getsockname()[1])
  finally:
    for s in queued:
      s.close()
    dead.close()
