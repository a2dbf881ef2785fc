"""The callback router on its own (no cluster): a worker's call reaches only
the route's client and its reply only that worker; a compile-time question
is asked once however many workers ask it; a client that goes away, or
never comes, fails what it owes at once or at its deadline."""
from __future__ import annotations

import concurrent.futures
import socket
import threading
import time

import numpy as np
import pytest

from jax_pathways.controller import callback_router
from jax_pathways.status import Code, invalid_argument
from jax_pathways.wire import callback_messages as msg

WAIT_S = 10.0  # only catches hangs


class Clients:
  """The gRPC server's side of the router: what it sent each stream."""

  def __init__(self):
    self.sent: dict[int, list[bytes]] = {}
    self.finished: dict[int, tuple[int, str]] = {}
    self.cv = threading.Condition()

  def send(self, stream: int, data: bytes) -> bool:
    with self.cv:
      if stream in self.finished:
        return False
      self.sent.setdefault(stream, []).append(data)
      self.cv.notify_all()
    return True

  def finish(self, stream: int, code: int, message: str) -> None:
    with self.cv:
      self.finished[stream] = (code, message)
      self.cv.notify_all()

  def next(self, stream: int, n: int = 1) -> dict:
    with self.cv:
      assert self.cv.wait_for(lambda: len(self.sent.get(stream, ())) >= n,
                              WAIT_S)
      return msg.decode(self.sent[stream][n - 1])


class Worker:
  """A worker's callbacks connection, raw."""

  def __init__(self, router: callback_router.CallbackRouter, island: int):
    self.sock, theirs = socket.socketpair()
    self.sock.settimeout(WAIT_S)
    router.add_worker(theirs, island)
    self.ids = iter(range(1, 1 << 30))

  def ask(self, header: dict, blobs=()) -> int:
    request = next(self.ids)
    msg.write_frame(self.sock, msg.encode({**header, "id": request}, blobs))
    return request

  def reply(self) -> tuple[dict, list]:
    return msg.decode(msg.read_frame(self.sock))


def _vet(module: bytes, island: int) -> None:
  """Stands for the reader processes: refuses what says it is evil."""
  VETTED.append((bytes(module), island))
  if b"evil" in module:
    raise invalid_argument("The partitioned program calls custom call "
                           "target 'evil'")


VETTED: list = []


@pytest.fixture
def router():
  clients = Clients()
  background = concurrent.futures.ThreadPoolExecutor(2)
  VETTED.clear()
  r = callback_router.CallbackRouter(clients.send, clients.finish, _vet,
                                     background)
  r.clients = clients
  yield r
  r.stop()
  background.shutdown()


def _answer(router, stream: int, call_id: int, blobs=(), **reply) -> None:
  router.from_client(stream, msg.encode({"kind": msg.REPLY, "id": call_id,
                                         **reply}, list(blobs)))


def test_a_call_reaches_its_client_and_the_reply_its_worker(router):
  router.open_client(1, "alice")
  router.open_client(2, "bob")
  route = router.new_route("bob", table=7, session=3)
  w = Worker(router, island=0)
  specs, blobs = msg.pack_arrays([None, np.arange(3.0)], "results")
  request = w.ask({"kind": msg.CALL, "route": route, "index": 1,
                   "args": specs}, blobs)
  header, out = router.clients.next(2)
  assert (header["kind"], header["table"], header["index"]) == (
      msg.CALL, 7, 1)
  assert 1 not in router.clients.sent  # alice never hears of it
  _answer(router, 2, header["id"], results=[])
  reply, _ = w.reply()
  assert reply == {"kind": msg.REPLY, "id": request, "results": []}
  # A reply from the wrong client for that call is dropped.
  request = w.ask({"kind": msg.CALL, "route": route, "index": 0,
                   "args": []})
  header, _ = router.clients.next(2, 2)
  _answer(router, 1, header["id"], results=[])
  _answer(router, 2, header["id"], error={"code": 13, "message": "boom"})
  reply, _ = w.reply()
  assert reply["id"] == request and reply["error"]["message"] == "boom"


def test_a_question_is_asked_once(router):
  router.open_client(5, "carol")
  route = router.new_route("carol", table=None, session=1)
  workers = [Worker(router, island=i) for i in range(2)]
  question = {"kind": msg.ASK, "route": route, "what": msg.PARTITION,
              "question": {"key": "12"}}
  for w in workers:
    w.ask(question, [b"sharding"])
  header, _ = router.clients.next(5)
  _answer(router, 5, header["id"], [b"module text"], module=0, shardings=[1])
  for w in workers:  # both answered by the one reply, vetted once
    assert w.reply()[0]["shardings"] == [1]
  # Read once, for the island that asked first.
  assert [m for m, _ in VETTED] == [b"module text"]
  # Later (a recompile on a new worker): answered without the client.
  late = Worker(router, island=1)
  late.ask(question, [b"sharding"])
  assert late.reply()[0]["module"] == 0
  assert len(router.clients.sent[5]) == 1
  # A released route's answers are gone, and so is the client's table.
  router.release(route)
  late.ask(question, [b"sharding"])
  assert "released" in late.reply()[0]["error"]["message"]


def test_a_partition_answer_reaches_no_worker_unvetted(router):
  """The module of a partition answer is read (in a reader process) before
  any worker gets it: one the reading refuses reaches the workers as the
  error, and is not kept (the next compile asks again)."""
  router.open_client(5, "erin")
  route = router.new_route("erin", table=None, session=1)
  w = Worker(router, island=1)
  question = {"kind": msg.ASK, "route": route, "what": msg.PARTITION,
              "question": {"key": "9"}}
  for n, (blobs, module) in enumerate([([b"evil module"], 0), ([], 0),
                                       ([b"x"], 7)], start=1):
    w.ask(question, [b"sharding"])
    header, _ = router.clients.next(5, n)
    _answer(router, 5, header["id"], blobs, module=module, shardings=[1])
    error = w.reply()[0]["error"]
    assert error["code"] == Code.INVALID_ARGUMENT
    assert ("custom call target 'evil'" if n == 1 else "has no module") in (
        error["message"])
  assert VETTED == [(b"evil module", 1)]


def test_a_client_that_leaves_fails_what_it_owed(router):
  router.open_client(9, "dave")
  route = router.new_route("dave", table=1, session=1)
  w = Worker(router, island=0)
  w.ask({"kind": msg.CALL, "route": route, "index": 0, "args": []})
  router.clients.next(9)
  router.close_client(9)
  reply, _ = w.reply()
  assert reply["error"]["code"] == Code.UNAVAILABLE
  assert "disconnected" in reply["error"]["message"]
  assert router.stats()["pending"] == 0


def test_a_client_that_never_comes_fails_at_the_deadline(router,
                                                         monkeypatch):
  monkeypatch.setattr(callback_router, "CLIENT_WAIT_S", 0.2)
  route = router.new_route("erin", table=1, session=1)
  w = Worker(router, island=0)
  w.ask({"kind": msg.CALL, "route": route, "index": 0, "args": []})
  reply, _ = w.reply()  # the sweep fails it
  assert "no callbacks stream open" in reply["error"]["message"]


def test_a_call_waits_for_its_clients_stream(router):
  route = router.new_route("fay", table=1, session=1)
  w = Worker(router, island=0)
  request = w.ask({"kind": msg.CALL, "route": route, "index": 0,
                   "args": []})
  time.sleep(0.05)  # not yet open: kept
  router.open_client(4, "fay")
  header, _ = router.clients.next(4)
  _answer(router, 4, header["id"], results=[])
  assert w.reply()[0]["id"] == request


def test_streams_and_messages_that_do_not_fit_are_refused(router):
  router.open_client(1, "")  # no id
  router.open_client(2, "g" * 100)  # too long
  router.open_client(3, "gus")
  router.open_client(4, "gus")  # its id is served on stream 3
  assert router.clients.finished[1][0] == Code.INVALID_ARGUMENT
  assert router.clients.finished[2][0] == Code.INVALID_ARGUMENT
  assert router.clients.finished[4][0] == Code.ALREADY_EXISTS
  router.from_client(3, b"garbage")
  assert router.clients.finished[3][0] == Code.INVALID_ARGUMENT
  w = Worker(router, island=0)
  w.ask({"kind": msg.CALL, "route": 999, "index": 0, "args": []})
  assert "unknown" in w.reply()[0]["error"]["message"]
  w.ask({"kind": "nonsense"})
  assert "not 'nonsense'" in w.reply()[0]["error"]["message"]


def test_a_client_that_does_not_read_owes_a_bounded_amount(router,
                                                           monkeypatch):
  """Calls a client has not answered count against it: past the bound the
  next call fails at once with why (what the controller holds for a
  stream that is never read stays bounded); its answers make room again;
  another client's calls go on meanwhile (issue 53 row 6)."""
  monkeypatch.setattr(callback_router, "MAX_OWED_BYTES", 3 << 20)
  router.open_client(1, "slow")
  router.open_client(2, "other")
  slow = router.new_route("slow", table=1, session=4)
  other = router.new_route("other", table=1, session=5)
  w = Worker(router, island=0)
  specs, blobs = msg.pack_arrays([np.zeros(1 << 18, np.float32)], "args")

  def call(route: int) -> int:
    return w.ask({"kind": msg.CALL, "route": route, "index": 0,
                  "args": specs}, blobs)

  call(slow)
  call(slow)  # 2 MiB owed, unread
  refused = call(slow)
  reply, _ = w.reply()
  assert reply["id"] == refused
  assert reply["error"]["code"] == int(Code.RESOURCE_EXHAUSTED)
  assert "client 4 has not answered 2 MiB" in reply["error"]["message"]
  assert "does not read its callbacks stream" in reply["error"]["message"]
  # Held for it: the two calls sent, never a copy kept besides.
  assert len(router.clients.sent[1]) == 2
  assert all(not p.message for p in router._pending.values())  # pylint: disable=protected-access
  answered = call(other)
  header, _ = router.clients.next(2)
  _answer(router, 2, header["id"], results=[])
  assert w.reply()[0] == {"kind": msg.REPLY, "id": answered, "results": []}
  # Answering makes room.
  first, _ = router.clients.next(1)
  _answer(router, 1, first["id"], results=[])
  w.reply()
  call(slow)
  assert router.clients.next(1, 3)[0]["kind"] == msg.CALL
