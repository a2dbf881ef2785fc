"""A compile its clients all left is dropped on the workers; one another
client still waits for goes on (issue 53 row 5)."""
from __future__ import annotations

import types

from jax_pathways.controller.compile_cache import CompileCache
from jax_pathways.controller.dispatcher import OpKind
from jax_pathways.status import Code, Status


class _Dispatcher:
  """Records gangs; runs nothing."""

  def __init__(self):
    self.gangs: list[tuple[list, object]] = []

  def submit(self, gang, on_done=None, client=0):
    self.gangs.append((list(gang), on_done))


def _program(key: str) -> types.SimpleNamespace:
  island = types.SimpleNamespace(id=0, generation=0)
  return types.SimpleNamespace(
      islands=(island,), key=key, device_refs=[0], replicas=1, route=0,
      callbacks=None, program=b"p", options=b"o", devices=(0,))


def test_a_compile_every_client_left_is_dropped():
  dispatcher = _Dispatcher()
  cache = CompileCache(dispatcher)
  answers = []
  cache.compile(_program("k"), lambda s, c: answers.append(s), client=1)
  [(compile_gang, finished)] = dispatcher.gangs
  assert [op.kind for op in compile_gang] == [OpKind.COMPILE]
  cache.abandon(1)
  [drop] = dispatcher.gangs[1][0]
  assert (drop.kind, drop.program) == (OpKind.DELETE, compile_gang[0].program)
  # The worker skipped it: nobody is answered, nothing is kept, and the
  # same program compiles anew (another id) for the next client.
  finished(Status(Code.CANCELLED, "dropped"), [])
  assert answers == []
  cache.compile(_program("k"), lambda s, c: answers.append(s), client=2)
  assert dispatcher.gangs[2][0][0].program != compile_gang[0].program


def test_a_compile_another_client_waits_for_goes_on():
  dispatcher = _Dispatcher()
  cache = CompileCache(dispatcher)
  answers: dict[int, Status] = {}
  for client in (1, 2):
    cache.compile(_program("k"),
                  lambda s, c, n=client: answers.setdefault(n, s),
                  client=client)
  cache.abandon(1)
  assert len(dispatcher.gangs) == 1  # compiled once, not dropped
  dispatcher.gangs[0][1](Status(Code.INTERNAL, "the worker's answer"), [])
  assert list(answers) == [2]
  assert answers[2].message == "the worker's answer"
