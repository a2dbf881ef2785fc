"""GlobalClient: which workers may run programs spanning islands, generation
by generation (real jaxlib coordination services, on loopback)."""
import pytest

from jax_pathways.controller.coordination import GlobalClient
from jax_pathways.resources.island import Island, IslandId
from jax_pathways.status import Code, Status, StatusError


def _island(number, generation):
  island = Island(IslandId(number), 4, "cpu", "cpu", 0, "", "")
  island.generation = generation
  return island


def test_generations_follow_the_islands_workers():
  g = GlobalClient(2, "127.0.0.1:0")
  try:
    first = g.address
    assert g.check([_island(0, 0), _island(1, 0)]) == 0
    # Island 1 rejoined, island 0 is as it was: not built yet.
    with pytest.raises(StatusError) as e:
      g.check([_island(0, 0), _island(1, 1)])
    assert e.value.status.code == Code.FAILED_PRECONDITION
    assert "island 1 (generation 1)" in e.value.status.message
    generation, address = g.renew({0: 0, 1: 1})
    assert generation == 1 and address != first
    assert g.renew({0: 0, 1: 1}) is None  # the same workers: nothing new
    # Launches may be numbered while it is built: the workers wait for it.
    assert g.check([_island(0, 0), _island(1, 1)]) == 1
    assert not g.member(_island(1, 1))
    g.finished(1, Status())
    assert g.member(_island(0, 0)) and g.member(_island(1, 1))
    assert not g.member(_island(1, 0))
    assert g.describe()["state"] == "ready"
  finally:
    g.shutdown()


def test_a_generation_that_failed_says_why_until_the_next():
  g = GlobalClient(2, "127.0.0.1:0")
  try:
    g.renew({0: 0, 1: 1})
    g.finished(1, Status(Code.DEADLINE_EXCEEDED, "island 0 did not join"))
    with pytest.raises(StatusError) as e:
      g.check([_island(0, 0), _island(1, 1)])
    assert e.value.status.code == Code.UNAVAILABLE
    assert "island 0 did not join" in e.value.status.message
    g.renew({0: 0, 1: 2})
    g.finished(1, Status(Code.INTERNAL, "late news of generation 1"))
    assert g.check([_island(0, 0), _island(1, 2)]) == 2
  finally:
    g.shutdown()
