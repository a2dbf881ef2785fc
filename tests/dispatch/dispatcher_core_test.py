"""The C++ dispatcher and executor, driven over socket pairs (no JAX)."""
import os
import socket
import struct
import threading
import time

import numpy as np
import pytest

from jax_pathways import _core
from jax_pathways import _server

OpKind = _core.OpKind


def _pair(window=2, memory=0):
  a, b = socket.socketpair()
  d = _core.Dispatcher(window)
  d.add_island(0, a.detach(), "w0", memory)
  return d, _core.Executor(b.detach())


def _poll_all(d, n, timeout=5.0):
  """Completions, payloads (uint8 arrays viewing the frames) as bytes."""
  out, deadline = [], time.monotonic() + timeout
  while len(out) < n and time.monotonic() < deadline:
    out += [(tag, code, msg, [bytes(p) for p in payloads])
            for tag, code, msg, payloads in d.poll(0.05, 100)]
  return out


def test_ops_arrive_in_order_and_window_bounds_launches():
  d, ex = _pair(window=2)
  for i in range(5):
    d.submit([(0, OpKind.LAUNCH, 7, [], [100 + i], b"p%d" % i)], 10 + i)
  d.submit([(0, OpKind.FETCH, 0, [100], [], b"")], 20)
  stats = d.stats()[0]
  assert stats["in_flight"] == 2 and stats["queued"] == 4
  seen = []
  for _ in range(6):
    op = ex.next(2.0)
    seen.append((op.seq, op.kind, bytes(op.payload)))
    ex.complete(op.seq, 0, "", b"r%d" % op.seq)
  assert [s[0] for s in seen] == [1, 2, 3, 4, 5, 6]
  assert seen[5][1] == OpKind.FETCH
  done = sorted(_poll_all(d, 6))
  assert done == [(10 + i, 0, "", [b"r%d" % (i + 1)]) for i in range(5)] + [
      (20, 0, "", [b"r6"])]
  assert d.state(104) == ("ready", (0, ""))


def test_a_payload_in_parts_arrives_whole():
  """(head, tails) payloads: the tails are sent after the head, in order,
  shared when the C++ side made them (an upload taken from HostBuffers, a
  view of a completion's payload), else copied; the worker sees one payload
  either way, also after Python drops the tails."""
  hb = _server.HostBuffers()
  hb.open_session(1)
  data = bytes(range(256)) * 5000
  hb.store(1, 7, data)
  upload, size = hb.take(1, 7)
  assert size == len(data)
  d, ex = _pair(window=8)
  d.submit([(0, OpKind.FETCH, 0, [], [], b"")], 1)
  ex.complete(ex.next(2.0).seq, 0, "", data)
  polled = []
  while not polled:
    polled = d.poll(2.0, 1)
  (_, _, _, (fetched,)), = polled
  assert not fetched.flags.writeable
  tails = [upload, fetched[1000:], np.frombuffer(data, np.uint8)[5:9],
           b"xyz", b""]
  expected = [data, data[1000:], data[5:9], b"xyz", b""]
  for i, tail in enumerate(tails):
    d.submit([(0, OpKind.PUT, 0, [], [300 + i], (b"head%d" % i, [tail]))], 1)
  d.submit([(0, OpKind.PUT, 0, [], [310], (b"all", tails))], 1)
  del tails, upload, fetched
  for i, want in enumerate(expected):
    op = ex.next(2.0)
    assert bytes(op.payload) == b"head%d" % i + want
  assert bytes(ex.next(2.0).payload) == b"all" + b"".join(expected)
  with pytest.raises(ValueError, match=r"head, \[tails\]"):
    d.submit([(0, OpKind.PUT, 0, [], [400], (b"a", [b"b"], b"c"))], 1)


def test_failure_poisons_results_and_later_users():
  d, ex = _pair()
  d.submit([(0, OpKind.LAUNCH, 1, [], [1], b"")], 1)
  op = ex.next(2.0)
  ex.complete(op.seq, 3, "bad shape", b"")
  assert _poll_all(d, 1) == [(1, 3, "bad shape", [b""])]
  assert d.state(1) == ("failed", (3, "bad shape"))
  # A later op using the failed buffer fails at once, without being sent.
  d.submit([(0, OpKind.LAUNCH, 1, [1], [2], b"")], 2)
  assert _poll_all(d, 1) == [(2, 3, "bad shape", [b""])]
  assert ex.next(0.2) is None
  d.when_ready([2], 3)
  assert _poll_all(d, 1) == [(3, 3, "bad shape", [])]


def test_a_delete_frees_good_buffers_beside_failed_ones():
  """A DELETE whose buffers include a failed one still reaches the worker
  (which holds the others, and the failed one's Status) and gives their
  memory back: refusing it, as a launch on a failed input is, would leak
  them for good."""
  d, ex = _pair(window=4, memory=1000)
  d.submit([(0, OpKind.PUT, 0, [], [1], b"")], 1, result_bytes=[[600]])
  d.submit([(0, OpKind.LAUNCH, 1, [], [2], b"")], 2, result_bytes=[[100]])
  put, launch = ex.next(2.0), ex.next(2.0)
  ex.complete(put.seq, 0, "", b"")
  ex.complete(launch.seq, 13, "the launch broke", b"")
  assert sorted(c[:2] for c in _poll_all(d, 2)) == [(1, 0), (2, 13)]
  d.submit([(0, OpKind.DELETE, 0, [1, 2], [], b"")], 0)
  d.forget([1, 2])
  op = ex.next(2.0)
  assert (op.kind, list(op.args)) == (OpKind.DELETE, [1, 2])
  assert d.stats()[0]["memory_used"] == 0


def test_when_ready_waits_for_pending_buffers():
  d, ex = _pair()
  d.submit([(0, OpKind.PUT, 0, [], [5], b"")], 0)
  d.when_ready([5], 9)
  assert d.poll(0.1, 10) == []
  op = ex.next(2.0)
  ex.complete(op.seq, 0, "", b"")
  assert _poll_all(d, 1) == [(9, 0, "", [])]


def test_dead_worker_fails_pending_and_later_ops():
  d, ex = _pair(window=1)
  d.submit([(0, OpKind.LAUNCH, 1, [], [1], b"")], 1)
  d.submit([(0, OpKind.LAUNCH, 1, [], [2], b"")], 2)  # held by the window
  ex.shutdown()
  done = sorted(_poll_all(d, 2))
  assert [c[0] for c in done] == [1, 2]
  assert all(c[1] == 15 and "w0" in c[2] for c in done)  # DATA_LOSS
  d.submit([(0, OpKind.LAUNCH, 1, [], [3], b"")], 3)
  (late,) = _poll_all(d, 1)
  assert late[1] == 15 and "w0 is lost" in late[2]
  assert d.stats()[0]["alive"] is False


def _islands(n, window=4):
  d = _core.Dispatcher(window)
  executors = []
  for island in range(n):
    a, b = socket.socketpair()
    d.add_island(island, a.detach(), f"w{island}", 0)
    executors.append(_core.Executor(b.detach()))
  return d, executors


def _spanning(d, executors, tag, results):
  """A launch on islands 0 and 1 (results[i] on island i): each island's
  op as its worker takes it."""
  d.submit([(i, OpKind.LAUNCH, 1, [], [r], b"") for i, r in
            enumerate(results)], tag)
  return [ex.next(2.0) for ex in executors]


def test_a_receive_fails_with_its_source_failed_while_it_waited():
  """A receive names its source (fails_with) without taking it: the send
  carries the bytes. When the source fails while both wait for the window,
  the dispatcher refuses the send, and must refuse the receive too, which
  would otherwise wait on its worker for bytes that never come."""
  d, (ex0, ex1) = _islands(2, window=1)
  d.submit([(0, OpKind.LAUNCH, 1, [], [100], b"")], 1)
  d.submit([(0, OpKind.LAUNCH, 1, [100], [200], b"")], 2)  # held: window
  d.submit([(0, OpKind.SEND, 9, [200], [], b"")], 3)
  d.submit([(1, OpKind.RECEIVE, 9, [], [300], b"")], 4, fails_with=[200])
  d.submit([(1, OpKind.RECEIVE, 9, [], [400], b"")], 5, fails_with=[0])
  first = ex0.next(2.0)
  ex0.complete(first.seq, 13, "the launch broke", b"")
  done = sorted(_poll_all(d, 4))
  assert [c[:3] for c in done] == [(t, 13, "the launch broke")
                                   for t in (1, 2, 3, 4)]
  assert d.state(300) == ("failed", (13, "the launch broke"))
  # Only the receive without a source to fail with reaches its worker.
  op = ex1.next(2.0)
  assert (op.kind, list(op.results)) == (OpKind.RECEIVE, [400])
  assert ex1.next(0.2) is None and ex0.next(0.2) is None


def test_a_forgotten_input_refused_while_it_waited_fails_its_users():
  """A launch's temporaries are forgotten as soon as its gangs are
  submitted; a gang still waiting for the window that uses one must read
  its failure when the gang making it is refused (not find it unknown and
  go to a worker that never had it)."""
  d, ex = _pair(window=1)
  d.submit([(0, OpKind.LAUNCH, 1, [], [100], b"")], 1)
  d.submit([(0, OpKind.LAUNCH, 1, [100], [200], b"")], 2)  # held: window
  d.submit([(0, OpKind.LAUNCH, 1, [200], [300], b"")], 3)
  d.forget([200])
  first = ex.next(2.0)
  ex.complete(first.seq, 13, "the launch broke", b"")
  done = sorted(_poll_all(d, 3))
  assert [c[:3] for c in done] == [(t, 13, "the launch broke")
                                   for t in (1, 2, 3)]
  assert ex.next(0.2) is None
  assert d.state(300) == ("failed", (13, "the launch broke"))
  # Dropped once nothing waits on it.
  assert d.state(200) == ("failed", (5, "buffer 200 is unknown"))


def test_a_lost_island_fails_its_gangs_everywhere_at_once():
  d, (ex0, ex1) = _islands(2)
  d.submit([(1, OpKind.PUT, 0, [], [7], b"")], 0, 0, [[64]])
  put = ex1.next(2.0)
  ex1.complete(put.seq, 0, "", b"")
  d.when_ready([7], 5)
  assert _poll_all(d, 1) == [(5, 0, "", [])]
  # A program spanning both islands; island 0's part never finishes.
  d.submit([(0, OpKind.LAUNCH, 1, [], [1], b""),
            (1, OpKind.LAUNCH, 1, [], [2], b"")], 1)
  launch = ex0.next(2.0)
  assert ex1.next(2.0).kind == OpKind.LAUNCH
  ex1.shutdown()
  (c,) = _poll_all(d, 1)
  assert c[0] == 1 and c[1] == 15 and "w1 is lost" in c[2], c
  assert d.state(1)[0] == "failed" and d.state(2)[0] == "failed"
  # What island 1 held is lost too.
  assert d.state(7) == ("failed", (15, c[2]))
  # Island 0 is told, before anything else it runs.
  notice = ex0.next(2.0)
  assert notice.kind == OpKind.PEER_LOST and notice.program == 1
  # Island 0's ops up to here were numbered before the loss: their moves
  # from island 1 come from the lost worker.
  assert notice.seq == launch.seq
  assert "w1 is lost" in bytes(notice.payload).decode()
  # Its late report changes nothing; its window is free again.
  ex0.complete(launch.seq, 15, "aborted", b"")
  d.submit([(0, OpKind.LAUNCH, 1, [], [3], b"")], 3)
  op = ex0.next(2.0)
  ex0.complete(op.seq, 0, "", b"")
  assert _poll_all(d, 1) == [(3, 0, "", [b""])]
  assert d.state(1)[0] == "failed"
  assert [s["alive"] for s in d.stats()] == [True, False]
  ex0.shutdown()


def test_a_lost_island_is_the_error_even_after_a_peer_reported_first():
  # Killed mid-collective, a worker's peers see their connection break,
  # and may say so before the controller sees the worker go.
  d, (ex0, ex1) = _islands(2)
  launch, other = _spanning(d, (ex0, ex1), 1, [1, 2])
  assert other.kind == OpKind.LAUNCH
  ex0.complete(launch.seq, 15, "aborted: a connection broke", b"")
  time.sleep(0.2)
  assert _poll_all(d, 1, timeout=0.2) == []  # island 1 has not answered
  ex1.shutdown()
  (c,) = _poll_all(d, 1)
  assert c[0] == 1 and c[1] == 15 and "w1 is lost" in c[2], c
  assert d.state(1) == ("failed", (15, c[2]))
  ex0.shutdown()


def test_a_broken_link_is_held_for_the_loss_that_names_the_worker():
  # The killed worker had reported its part; a peer's report that its link
  # broke comes before the controller reads the end of the killed one's
  # connection. The gang waits for that loss, whose words name the worker.
  d, (ex0, ex1) = _islands(2)
  launch, other = _spanning(d, (ex0, ex1), 1, [1, 2])
  ex1.complete(other.seq, 0, "", b"")
  ex0.complete(launch.seq, 15, f"{_core.BROKEN_LINK} (Gloo: closed)", b"")
  assert _poll_all(d, 1, timeout=0.5) == []  # held
  assert d.state(1)[0] == "pending"
  ex1.shutdown()
  (c,) = _poll_all(d, 1)
  assert c[0] == 1 and c[1] == 15 and "w1 is lost" in c[2], c
  assert d.state(1) == ("failed", (15, c[2]))
  assert d.state(2) == ("failed", (15, c[2]))
  ex0.shutdown()


def test_ops_failed_by_a_held_broken_link_take_the_loss_words_too():
  """A worker fails the ops after a failed launch with its failure: here
  a copy of its result and a fetch of the copy, on island 0 only, report
  the broken link before the controller sees island 1 go. They wait for
  the launch's cause rather than tell the user only that a link broke."""
  d, (ex0, ex1) = _islands(2)
  launch, other = _spanning(d, (ex0, ex1), 1, [1, 2])
  d.submit([(0, OpKind.COPY, 0, [1], [10], b"")], 2)
  d.submit([(0, OpKind.FETCH, 0, [10], [], b"")], 3)
  words = f"{_core.BROKEN_LINK} (Gloo: closed)"
  ex0.complete(launch.seq, 15, words, b"")
  for _ in range(2):
    ex0.complete(ex0.next(2.0).seq, 15, words, b"")
  time.sleep(0.2)
  d.forget([1, 10])  # the client let go of both: their failure still counts
  assert _poll_all(d, 1, timeout=0.5) == []  # all held: island 1 is silent
  ex1.shutdown()
  done = sorted(_poll_all(d, 3))
  assert [c[0] for c in done] == [1, 2, 3], done
  for c in done:
    assert c[1] == 15 and "w1 is lost" in c[2], c
  assert ex0.next(2.0).kind == OpKind.PEER_LOST
  # A later op failed by a broken link whose input is known good is its own
  # failure: not held.
  d.submit([(0, OpKind.LAUNCH, 1, [], [20], b"")], 4)
  ex0.complete(ex0.next(2.0).seq, 0, "", b"")
  d.submit([(0, OpKind.COPY, 0, [20], [21], b"")], 5)
  ex0.complete(ex0.next(2.0).seq, 15, words, b"")
  assert sorted(_poll_all(d, 2, timeout=1.0)) == [(4, 0, "", [b""]),
                                                  (5, 15, words, [b""])]
  ex0.shutdown()


def test_a_broken_link_with_no_loss_behind_it_fails_in_its_own_words():
  d, (ex0, ex1) = _islands(2)
  launch, other = _spanning(d, (ex0, ex1), 1, [1, 2])
  ex1.complete(other.seq, 0, "", b"")
  words = f"{_core.BROKEN_LINK} (Gloo: closed)"
  ex0.complete(launch.seq, 15, words, b"")
  # Held for a loss that might explain it (the dispatcher's heartbeat looks
  # each second, and lets it go at the second look)...
  assert _poll_all(d, 1, timeout=0.3) == []
  # ... then failed in its own words.
  (c,) = _poll_all(d, 1, timeout=30)
  assert c == (1, 15, words, [b"", b""]), c
  # Another error, or a gang on one island, is never held.
  d.submit([(0, OpKind.LAUNCH, 1, [], [3], b"")], 2)
  ex0.complete(ex0.next(2.0).seq, 15, words, b"")
  assert _poll_all(d, 1, timeout=1.0) == [(2, 15, words, [b""])]
  launch, other = _spanning(d, (ex0, ex1), 3, [4, 5])
  ex0.complete(launch.seq, 13, "INTERNAL: no", b"")
  ex1.complete(other.seq, 0, "", b"")
  assert _poll_all(d, 1, timeout=1.0) == [(3, 13, "INTERNAL: no", [b"", b""])]
  # Shutting down ends a held gang too.
  launch, other = _spanning(d, (ex0, ex1), 4, [6, 7])
  ex0.complete(launch.seq, 15, words, b"")
  ex1.complete(other.seq, 0, "", b"")
  time.sleep(0.2)
  d.shutdown()
  assert d.state(6)[0] == "failed"
  ex0.shutdown()
  ex1.shutdown()


def test_a_silent_worker_is_lost_and_a_live_one_is_not():
  d, (ex0,) = _islands(1)
  a, b = socket.socketpair()  # island 1: one heartbeat, then silence
  d.add_island(1, a.detach(), "w1", 0)
  # Island 2: joined, then nothing (a worker stopped right after its
  # handshake, before its first heartbeat: it used to be kept for ever).
  a2, b2 = socket.socketpair()
  d.add_island(2, a2.detach(), "w2", 0)
  b.sendall(struct.pack("<IIQ", 0x4a505746, 9, 0))  # channel.h kHeartbeat
  d.submit([(1, OpKind.LAUNCH, 1, [], [1], b"")], 1)
  time.sleep(2.5)  # two heartbeats from island 0's executor
  d.expire_silent_islands(2.0)
  (c,) = _poll_all(d, 1)
  assert c[1] == 15 and "w1 is lost" in c[2] and "heartbeat" in c[2], c
  assert [s["alive"] for s in d.stats()] == [True, False, False]
  b.close()
  b2.close()
  ex0.shutdown()


def test_unknown_island_and_malformed_gangs_fail_whole():
  d, ex = _pair()
  d.submit([(0, OpKind.LAUNCH, 1, [], [1], b""),
            (3, OpKind.LAUNCH, 1, [], [2], b"")], 1)
  (c,) = _poll_all(d, 1)
  assert c[1] == 5 and "island 3 does not exist" in c[2]
  assert ex.next(0.2) is None  # nothing was sent to island 0 either
  d.submit([], 2)
  assert _poll_all(d, 1)[0][1] == 3


def test_gang_order_is_consistent_across_islands():
  d = _core.Dispatcher(8)
  executors = []
  for island in range(3):
    a, b = socket.socketpair()
    d.add_island(island, a.detach(), f"w{island}")
    executors.append(_core.Executor(b.detach()))
  # Submitted from several threads at once: every pair of gangs that share
  # islands must be in the same relative order on each island they share.
  gangs = {}

  def submit(start):
    for g in range(start, start + 50):
      islands = [i for i in range(3) if (g >> i) & 1] or [0]
      gangs[g] = islands
      d.submit([(i, OpKind.COPY, g, [], [], b"") for i in islands], 0)

  threads = [threading.Thread(target=submit, args=(k * 50,)) for k in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  order = []
  for ex in executors:
    seq = []
    while (op := ex.next(0.2)) is not None:
      seq.append(op.program)
      ex.complete(op.seq, 0, "", b"")
    order.append(seq)
  position = [{g: k for k, g in enumerate(seq)} for seq in order]
  for g1 in gangs:
    for g2 in gangs:
      shared = set(gangs[g1]) & set(gangs[g2])
      if g1 < g2 and len(shared) > 1:
        signs = {position[i][g1] < position[i][g2] for i in shared}
        assert len(signs) == 1, (g1, g2, shared)


def test_executor_reorders_frames_by_sequence_number():
  a, b = socket.socketpair()
  d = _core.Dispatcher(64)
  d.add_island(0, a.detach(), "w0")
  ex = _core.Executor(b.detach())
  for i in range(20):
    d.submit([(0, OpKind.DELETE, 0, [i], [], b"")], 0)
  assert [ex.next(1.0).seq for _ in range(20)] == list(range(1, 21))


def test_garbage_from_worker_kills_only_that_island():
  a, b = socket.socketpair()
  d = _core.Dispatcher(4)
  d.add_island(0, a.detach(), "w0")
  d.submit([(0, OpKind.LAUNCH, 1, [], [1], b"")], 1)
  b.sendall(b"this is not a frame header......")
  (c,) = _poll_all(d, 1)
  assert c[1] == 15 and "bad frame header" in c[2]
  b.close()


def test_executor_raises_once_controller_is_gone():
  a, b = socket.socketpair()
  ex = _core.Executor(b.detach())
  a.close()
  with pytest.raises(_core.JaxPathwaysError, match="controller connection lost") as e:
    ex.next(2.0)
  assert e.value.code == 14


def test_executor_hears_the_controller_while_the_op_loop_is_away():
  """Nothing calls next() for longer than the controller timeout (the op
  loop runs a long program): the controller's heartbeats must still be
  read, or a busy worker would think its controller silent and exit."""
  a, b = socket.socketpair()
  d = _core.Dispatcher(4)
  d.add_island(0, a.detach(), "w0")  # sends a heartbeat every second
  ex = _core.Executor(b.detach(), "c", 2.5)
  time.sleep(5.0)
  assert ex.lost() == ""
  d.submit([(0, OpKind.LAUNCH, 1, [], [1], b"late")], 1)
  assert bytes(ex.next(2.0).payload) == b"late"


def test_executor_notices_a_silent_controller_while_the_op_loop_is_away():
  a, b = socket.socketpair()  # `a` sends nothing, not even heartbeats
  ex = _core.Executor(b.detach(), "c", 2.0)
  deadline = time.monotonic() + 10.0
  while not ex.lost() and time.monotonic() < deadline:
    time.sleep(0.1)
  assert "is lost: it sent nothing, not even a heartbeat" in ex.lost()
  with pytest.raises(_core.JaxPathwaysError, match="is lost"):
    ex.next(1.0)
  a.close()


def test_executor_sees_the_end_behind_ops_before_handing_them_out():
  """Ops followed by the connection's end, both in before the op loop
  asks: the end is known (lost()) when they are handed out, so a worker resumed after its loss (SIGCONT) runs
  none of them (Worker.run asks lost() before each op)."""
  a, b = socket.socketpair()
  d = _core.Dispatcher(8)
  d.add_island(0, a.detach(), "w0")
  ex = _core.Executor(b.detach())
  d.submit([(0, OpKind.DELETE, 0, [0], [], b"")], 0)
  assert ex.next(2.0).seq == 1  # the read probe before it is answered
  for i in range(3):
    d.submit([(0, OpKind.DELETE, 0, [i], [], b"")], 0)
  d.shutdown()
  time.sleep(0.2)  # all of it in the socket before the op loop reads
  ops = ex.next_batch(2.0, 64)
  assert [op.seq for op in ops] == [2, 3, 4]
  assert "controller connection lost" in ex.lost()


def _frame(kind: int, body: bytes) -> bytes:
  """A raw frame (channel.h)."""
  return struct.pack("<IIQ", 0x4a505746, kind, len(body)) + body


def _lent_op_frame(locations: bytes) -> bytes:
  """A raw OpLocal frame, no stage, whose op part is empty: only its
  Locations matter to the tests below."""
  return _frame(6, struct.pack("<Q", 0) + locations)


@pytest.mark.parametrize("locations, error", [
    # Says 5 Locations, holds 1.
    (struct.pack("<I", 5) + struct.pack("<QQQ", os.getpid(), 4096, 8),
     "malformed op frame"),
    # Where nothing is mapped.
    (struct.pack("<I", 1) + struct.pack("<QQQ", os.getpid(), 8, 64),
     "could not read an upload from the controller's memory"),
], ids=["count_past_the_frame", "unmapped"])  # ids without the pid: xdist
# workers must collect the same tests
def test_executor_fails_clearly_on_bad_lent_tails(locations, error):
  a, b = socket.socketpair()
  ex = _core.Executor(b.detach())
  a.sendall(_lent_op_frame(locations))
  with pytest.raises(_core.JaxPathwaysError, match=error) as e:
    ex.next(2.0)
  assert e.value.code == 14  # the connection is dropped: UNAVAILABLE
  a.close()


def test_executor_drops_stages_it_cannot_fill_and_fails_on_malformed_ones():
  """A stage part that cannot be read (the controller dropped the upload),
  or asks for more than this host's memory only drops the stage (any
  part may come first: an array's shards interleave): the connection
  stays. A malformed stage frame drops it."""
  a, b = socket.socketpair()
  ex = _core.Executor(b.detach())
  unmapped = struct.pack("<I", 1) + struct.pack("<QQQ", os.getpid(), 8, 64)
  a.sendall(_frame(10, struct.pack("<QQQ", 7, 64, 0) + unmapped))
  a.sendall(_frame(10, struct.pack("<QQQ", 8, 64, 32) + unmapped))
  a.sendall(_frame(10, struct.pack("<QQQ", 9, 1 << 62, 0) + unmapped))
  a.sendall(_frame(11, struct.pack("<Q", 10)))  # an unknown stage's end
  assert ex.next(0.3) is None
  assert ex.lost() == ""
  a.sendall(_frame(10, struct.pack("<QQ", 7, 64)))  # truncated
  with pytest.raises(_core.JaxPathwaysError, match="malformed stage frame"):
    ex.next(2.0)
  assert ex.staged_puts == (0, 0)
  a.close()


def _stage_data(stage: int, total: int, offset: int, data: bytes) -> bytes:
  return _frame(12, struct.pack("<QQQ", stage, total, offset) + data)


@pytest.mark.parametrize("frames, error", [
    # Past the stage's end.
    ([_stage_data(7, 64, 60, b"x" * 8)], "malformed stage data"),
    ([_stage_data(7, 64, 65, b"")], "malformed stage data"),
    # More than the stage's announced size, in all or in its other parts.
    ([_stage_data(7, 8, 0, b"x" * 8), _stage_data(7, 8, 8, b"y")],
     "malformed stage data"),
    ([_stage_data(7, 8, 4, b"x" * 4), _stage_data(7, 8, 0, b"y" * 6)],
     "malformed stage data"),
    # Another size for a stage it holds.
    ([_stage_data(7, 64, 0, b"x" * 8), _stage_data(7, 128, 8, b"y")],
     "malformed stage data"),
    ([_frame(12, struct.pack("<QQ", 7, 8))], "malformed stage data"),
    # Room for more than a controller sends a worker at once.
    ([_stage_data(7, (1 << 30) + 1, 0, b"x")], "malformed stage data"),
    # A PUT of a stage it holds only part of, or not at all (ended).
    ([_stage_data(7, 64, 0, b"x" * 8), _frame(13, struct.pack("<Q", 7))],
     "does not hold whole"),
    ([_stage_data(7, 8, 0, b"x" * 8), _frame(11, struct.pack("<Q", 7)),
      _frame(13, struct.pack("<Q", 7))], "does not hold whole"),
    ([_frame(13, b"")], "malformed op frame"),
])
def test_stage_data_no_controller_sends_fails_the_connection(frames, error):
  """A worker on another host holds the bytes sent for a stage until its
  PUT, which comes without them: a controller that sends them out of order
  or too many, or a PUT of a stage not held whole, is broken, and the
  worker's connection to it fails rather than put the wrong bytes."""
  a, b = socket.socketpair()
  ex = _core.Executor(b.detach())
  # A stage held whole and ended changes nothing; nor do its parts out of
  # order (an array's shards, uploaded at once, interleave).
  a.sendall(_stage_data(3, 4, 2, b"cd") + _stage_data(3, 4, 0, b"ab") +
            _frame(11, struct.pack("<Q", 3)))
  assert ex.next(0.2) is None and ex.lost() == ""
  a.sendall(b"".join(frames))
  with pytest.raises(_core.JaxPathwaysError, match=error):
    ex.next(2.0)
  a.close()


def test_peer_links_move_bytes_and_errors():
  a, b = socket.socketpair()
  sender, receiver = _core.PeerLinks(), _core.PeerLinks()
  out = sender.add(a.detach(), "peer-b")
  inc = receiver.add(b.detach(), "peer-a")
  data = bytes(range(256)) * 1000
  sender.send(out, 7, 0, "", data)
  sender.send(out, 8, 13, "source failed", b"")
  assert bytes(receiver.receive(inc, 7, 2.0)) == data
  with pytest.raises(_core.JaxPathwaysError, match="source failed"):
    receiver.receive(inc, 8, 2.0)
  with pytest.raises(TimeoutError, match="did not arrive"):
    receiver.receive(inc, 9, 0.1)
  sender.shutdown()
  with pytest.raises(_core.JaxPathwaysError, match="lost"):
    receiver.receive(inc, 10, 2.0)
  receiver.shutdown()


def _serve(ex, n, seconds):
  """A fake worker: runs n ops, each reported as having held the island
  `seconds` (what fair sharing charges); returns their payloads."""
  served = []
  for _ in range(n):
    op = ex.next(5.0)
    assert op is not None, f"only {len(served)} of {n} ops arrived"
    served.append(bytes(op.payload))
    ex.complete(op.seq, 0, "", b"", seconds)
  return served


def test_saturated_island_is_shared_by_weight():
  d, ex = _pair(window=1)
  d.set_weight(1, 1.0)
  d.set_weight(2, 3.0)
  # The island's first launch is sent at once and holds it while the rest are
  # submitted (slow under a sanitizer): a third client's, so that time is
  # charged to neither of the two compared.
  d.submit([(0, OpKind.LAUNCH, 7, [], [1], b"3")], 0, 3)
  for client in (1, 2):
    for i in range(40):
      d.submit([(0, OpKind.LAUNCH, 7, [], [client * 1000 + i],
                 b"%d" % client)], 0, client)
  assert _serve(ex, 1, 0) == [b"3"]
  served = _serve(ex, 32, 0.005)
  # Device time 1:3 while both wait: 8 of client 1's, 24 of client 2's.
  assert served.count(b"1") == 8, served
  deadline = time.monotonic() + 30  # hang guard: the reader takes the last
  while True:                       # completion
    shares = {s["client"]: s for s in d.shares()}
    if len(served) * 0.005 - sum(shares[c]["device_seconds"]
                                 for c in (1, 2)) < 1e-9:
      break
    assert time.monotonic() < deadline, shares
    time.sleep(0.01)
  assert shares[1]["device_seconds"] == pytest.approx(8 * 0.005)
  assert shares[2]["device_seconds"] == pytest.approx(24 * 0.005)
  # The rest are held, not yet numbered (but the one sent since).
  assert d.stats()[0]["queued"] == 80 - 32 - 1


def test_an_idle_client_banks_no_credit():
  d, ex = _pair(window=1)
  for i in range(20):
    d.submit([(0, OpKind.LAUNCH, 7, [], [100 + i], b"a")], 0, 1)
  _serve(ex, 10, 0.003)  # client 1 alone: it gets everything
  for i in range(10):
    d.submit([(0, OpKind.LAUNCH, 7, [], [200 + i], b"b")], 0, 2)
  # Client 2 was idle: it starts level, not ahead by 10 launches' worth.
  served = _serve(ex, 10, 0.003)
  assert served.count(b"a") == 5, served


def test_clients_returning_together_start_level():
  d, ex = _pair(window=1)
  for i in range(10):
    d.submit([(0, OpKind.LAUNCH, 7, [], [100 + i], b"a")], 0, 1)
  _serve(ex, 10, 0.003)  # client 1 alone, then everyone idle
  time.sleep(0.05)
  for client, tag in ((2, b"b"), (1, b"a")):  # 2 arrives first, 1 right after
    for i in range(10):
      d.submit([(0, OpKind.LAUNCH, 7, [], [client * 1000 + i], tag)], 0,
               client)
  # Client 1's past does not count against it: they alternate.
  served = _serve(ex, 10, 0.003)
  assert served.count(b"a") == 5, served


def test_a_forgotten_client_goes_once_its_work_is_done():
  d, ex = _pair(window=1)
  for i in range(3):
    d.submit([(0, OpKind.LAUNCH, 7, [], [100 + i], b"a")], 0, 5)
  d.forget_client(5)  # its session ended with work queued
  assert 5 in {s["client"] for s in d.shares()}
  _serve(ex, 3, 0.001)
  deadline = time.monotonic() + 5
  while 5 in {s["client"] for s in d.shares()}:
    assert time.monotonic() < deadline, d.shares()
    time.sleep(0.01)


def _put(d, buffer, size, client, tag=0):
  d.submit([(0, OpKind.PUT, 0, [], [buffer], b"")], tag, client, [[size]])


def test_memory_is_budgeted_in_gang_order():
  d, ex = _pair(memory=1000)
  _put(d, 1, 600, client=1)
  _put(d, 2, 600, client=2)  # does not fit until buffer 1 goes
  assert ex.next(2.0).results == [1]
  assert ex.next(0.2) is None
  stats = d.stats()[0]
  assert (stats["memory_used"], stats["memory_capacity"]) == (600, 1000)
  assert stats["queued"] == 1
  d.submit([(0, OpKind.DELETE, 0, [1], [], b"")], 0, 1)
  assert ex.next(2.0).kind == OpKind.DELETE  # frees, in order, then...
  assert ex.next(2.0).results == [2]         # ... the held upload goes
  assert d.stats()[0]["memory_used"] == 600


def test_what_can_never_fit_fails_clearly_and_loses_nothing():
  d, ex = _pair(memory=1000)
  _put(d, 1, 600, client=1, tag=6)
  op = ex.next(2.0)
  ex.complete(op.seq, 0, "", b"")
  _put(d, 2, 2000, client=1, tag=7)  # more than the island has
  _put(d, 3, 600, client=1, tag=8)   # only this client could make room
  done = dict((tag, (code, msg)) for tag, code, msg, _ in _poll_all(d, 3))
  assert done[6] == (0, "")
  assert done[7] == (8, "out of device memory: the results need 2.0 KiB on "
                     "island 0 (w0), which has 1000 B in all; use more "
                     "devices or smaller arrays")
  assert done[8] == (8, "out of device memory on island 0 (w0): the results "
                     "need 600 B but this client's arrays already hold 600 B "
                     "of its 1000 B; delete arrays you no longer need (or "
                     "let them go) first")
  assert d.state(1) == ("ready", (0, ""))  # what was computed is kept
  assert d.state(3)[0] == "failed"
  assert ex.next(0.2) is None


def test_a_wait_for_memory_is_bounded():
  d, ex = _pair(memory=1000)
  _put(d, 1, 600, client=1)
  _put(d, 2, 600, client=2, tag=9)  # waits for client 1's memory...
  d.expire_memory_waits(30.0)
  assert d.stats()[0]["queued"] == 1
  time.sleep(0.2)
  d.expire_memory_waits(0.1)        # ... but not for ever
  (tag, code, msg, _), = _poll_all(d, 1)
  assert (tag, code) == (9, 8)
  assert msg.startswith("out of device memory on island 0 (w0): waited 0 s "
                        "for other clients to free 600 B of its 1000 B")
  assert d.stats()[0]["queued"] == 0


def _wait_for(predicate, timeout=5.0):
  deadline = time.monotonic() + timeout
  while not predicate():
    assert time.monotonic() < deadline, "timed out"
    time.sleep(0.01)


def test_a_local_worker_reads_large_uploads_from_the_controller():
  """On one host the worker answers the dispatcher's probe, and an op's
  tails (uploads, padding between them) of 64 KiB or more in all are lent
  (it copies them out of the controller's memory, in order, after the head)
  and kept alive until the op finishes; smaller ones are sent."""
  hb = _server.HostBuffers()
  hb.open_session(1)
  rng = np.random.default_rng(0)
  big, shard = rng.bytes(1 << 20), rng.bytes(40 << 10)
  hb.store(1, 7, big)
  hb.store(1, 8, shard)
  hb.store(1, 9, shard[::-1])
  d, ex = _pair(window=8)
  _wait_for(lambda: d.stats()[0]["reads_locally"])
  uploads = [hb.take(1, h)[0] for h in (7, 8, 9)]  # (pieces, size)
  d.submit([(0, OpKind.PUT, 0, [], [1], (b"h" * 64, [uploads[0]]))], 1)
  # Shards of 40 KiB each: lent, as together they are 80 KiB.
  d.submit([(0, OpKind.PUT, 0, [], [2],
             (b"g" * 64, [uploads[1], b"p" * 3, uploads[2]]))], 2)
  d.submit([(0, OpKind.PUT, 0, [], [3], (b"s", [b"small", b"er"]))], 3)
  # An upload in the pieces gRPC received it in: more pieces (with empty
  # ones) than one read takes.
  cuts = sorted(rng.integers(0, len(big), 1100)) + [len(big)]
  pieces = [big[a:b] for a, b in zip([0] + cuts, cuts)]
  d.submit([(0, OpKind.PUT, 0, [], [4], (b"k" * 64, pieces))], 4)
  del uploads, pieces
  op = ex.next(2.0)
  assert bytes(op.payload) == b"h" * 64 + big
  assert np.frombuffer(op.payload, np.uint8)[64:].ctypes.data % 64 == 0
  assert bytes(ex.next(2.0).payload) == (b"g" * 64 + shard + b"p" * 3 +
                                         shard[::-1])
  assert bytes(ex.next(2.0).payload) == b"ssmaller"
  assert bytes(ex.next(2.0).payload) == b"k" * 64 + big
  assert d.stats()[0]["lent"] == 3  # until the worker says it is done
  for seq in (1, 2, 3, 4):
    ex.complete(seq, 0, "", b"")
  assert sorted(c[0] for c in _poll_all(d, 4)) == [1, 2, 3, 4]
  assert d.stats()[0]["lent"] == 0


def test_a_worker_over_tcp_gets_uploads_sent():
  listener = socket.create_server(("127.0.0.1", 0))
  a = socket.create_connection(listener.getsockname())
  b, _ = listener.accept()
  listener.close()
  d = _core.Dispatcher(2)
  d.add_island(0, a.detach(), "w0", 0)
  ex = _core.Executor(b.detach())
  data = bytes(range(256)) * 1024
  d.submit([(0, OpKind.PUT, 0, [], [1],
             (b"h", [np.frombuffer(data, np.uint8), b"p", data[:7]]))], 1)
  assert bytes(ex.next(2.0).payload) == b"h" + data + b"p" + data[:7]
  stats = d.stats()[0]
  assert not stats["reads_locally"] and stats["lent"] == 0


def _event_frame(seq: int, device_ns: int) -> bytes:
  """A raw OK event frame with no payload (messages.cc's layout)."""
  head = struct.pack("<QiQQ", seq, 0, 0, device_ns)
  pad = (64 - (len(head) + 12) % 64) % 64  # the payload's alignment
  return _frame(2, head + struct.pack("<I", pad) + b"\0" * pad +
                struct.pack("<Q", 0))


def test_device_time_reports_are_charged_and_checked():
  """A worker's report of how long a launch held its island is what the
  client is charged; it is bounded where it is made and again where it
  enters the controller."""
  d, ex = _pair(window=1)
  d.submit([(0, OpKind.LAUNCH, 7, [], [1], b"")], 0, 1)
  op = ex.next(5.0)
  for bad in (-1.0, float("nan"), float("inf"), 86401.0):
    with pytest.raises(ValueError, match="device_seconds"):
      ex.complete(op.seq, 0, "", b"", bad)
  # Frames written by hand: 7 s is charged as reported (no wall clock in
  # it); past the bound (a day) the worker is lost and its launch fails
  # with why, nothing charged.
  for island, client, device_ns in ((1, 2, 7 * 10**9), (2, 3, 86401 * 10**9)):
    a, b = socket.socketpair()
    d.add_island(island, a.detach(), f"w{island}", 0)
    d.submit([(island, OpKind.LAUNCH, 7, [], [10 * island], b"")], island,
             client)
    b.sendall(_event_frame(1, device_ns))
    [(tag, code, message, _)] = _poll_all(d, 1)
    shares = {s["client"]: s["device_seconds"] for s in d.shares()}
    if device_ns == 7 * 10**9:
      assert (tag, code) == (island, 0), message
      assert shares[client] == 7.0
    else:
      assert (tag, code) == (island, 15), message
      assert "malformed event frame" in message
      assert shares.get(client, 0.0) == 0.0
    b.close()
