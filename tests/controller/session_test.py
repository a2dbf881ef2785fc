"""Session: requests that wait park the session, keep their order, time out
and are cancelled, without a cluster (fake services)."""
import time

from jax_pathways.controller.session import Services, Session
from jax_pathways.status import Code
from jax_pathways.wire import protos


class _Uploads:
  """host_buffers as the session sees it: take() -> (pieces, size) or
  None."""

  def __init__(self):
    self.stored: dict[int, bytes] = {}

  def take(self, session: int, handle: int, stream=None):
    data = self.stored.pop(handle, None)
    return None if data is None else (data, len(data))


class _Dispatcher:
  def for_client(self, client: int, weight: float) -> "_Dispatcher":
    return self


def _session(timeout_s: float = 60.0) -> tuple[Session, _Uploads, list]:
  uploads, sent = _Uploads(), []
  services = Services(topology=None, dispatcher=_Dispatcher(),
                      host_buffers=uploads, compile_cache=None,
                      resources=None, platform_version="",
                      upload_timeout_s=timeout_s)

  def make_array(session, req, reply):
    data = session.take_upload(req.host_buffer_handle)
    reply.ok(lambda r: setattr(r, "array_handle", data.nbytes))

  def layout(session, req, reply):
    reply.ok()

  handlers = {"make_array_from_host_buffer_request": make_array,
              "get_default_layout_request": layout}
  return Session(1, 25, services, handlers, {}, sent.append), uploads, sent


def _request(op_id: int, kind: str, **fields):
  req = protos.msg("xla.ifrt.proxy.IfrtRequest")()
  req.request_metadata.op_id = op_id
  body = getattr(req, kind)
  body.SetInParent()
  for k, v in fields.items():
    setattr(body, k, v)
  return req


def _answers(sent: list) -> list[tuple[int, int]]:
  return [(r.response_metadata.op_id, r.response_metadata.status.code)
          for r in sent]


def test_a_waiting_request_holds_those_behind_it_until_woken():
  session, uploads, sent = _session()
  session.handle(_request(1, "make_array_from_host_buffer_request",
                          host_buffer_handle=7))
  session.handle(_request(2, "get_default_layout_request"))
  assert session.waiting and sent == []
  session.resume()  # woken for another session's upload: still waiting
  assert session.waiting and sent == []
  uploads.stored[7] = b"abc"
  session.resume()
  assert not session.waiting
  assert _answers(sent) == [(1, 0), (2, 0)]
  assert sent[0].make_array_from_host_buffer_response.array_handle == 3


def test_a_wait_past_its_deadline_fails_and_the_next_request_runs():
  session, _, sent = _session(timeout_s=0.05)
  session.handle(_request(1, "make_array_from_host_buffer_request",
                          host_buffer_handle=7))
  session.handle(_request(2, "get_default_layout_request"))
  assert session.deadline is not None
  time.sleep(0.06)
  session.resume()
  assert _answers(sent) == [(1, Code.DEADLINE_EXCEEDED), (2, 0)]
  assert sent[0].response_metadata.status.message == (
      "the upload of host buffer 7 did not arrive within 0 s")
  assert not session.waiting and session.deadline is None


def test_a_session_that_ends_cancels_what_waits_and_is_idle_after():
  session, _, sent = _session()
  idle = []
  session.handle(_request(1, "make_array_from_host_buffer_request",
                          host_buffer_handle=7))
  session.handle(_request(2, "make_array_from_host_buffer_request",
                          host_buffer_handle=8))
  session.when_answered(lambda: idle.append(True))
  session.end()
  session.resume()
  assert _answers(sent) == [(1, Code.CANCELLED), (2, Code.CANCELLED)]
  assert idle == [True]


def test_a_session_waits_for_the_cluster_without_holding_anyone_else():
  # At 385bf6b the first request of a client arriving before every worker
  # had joined blocked the thread serving every session (up to 120 s).
  from jax_pathways.resources.topology import Topology
  topology = Topology(1)
  woken = []
  slices = []

  class Resources:
    def allocate(self, session_id, request):
      slices.append(session_id)
      return "the slice"

  sent = []
  services = Services(topology=topology, dispatcher=_Dispatcher(),
                      host_buffers=_Uploads(), compile_cache=None,
                      resources=Resources(), platform_version="")

  def init(session, req, reply):
    assert session.slice == "the slice"
    reply.ok()

  session = Session(1, 25, services, {"init_request": init}, {}, sent.append,
                    wake=lambda: woken.append(True))
  session.handle(_request(1, "init_request"))
  assert session.waiting and sent == [] and slices == []
  topology.register({"island": 0, "num_devices": 4})
  topology.connected(0)
  assert woken == [True]
  session.resume()
  assert _answers(sent) == [(1, 0)] and slices == [1]
