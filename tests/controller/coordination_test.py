"""GlobalClient: which workers may run programs spanning islands, generation
by generation, following the islands that are up (real jaxlib coordination
services, on loopback; the controller's side faked)."""
import pytest

from jax_pathways.controller.coordination import GlobalClient
from jax_pathways.resources.island import Island, IslandId
from jax_pathways.status import Code, Status, StatusError


def _island(number, generation=0):
  island = Island(IslandId(number), 4, "cpu", "cpu", 0, "", "")
  island.generation = generation
  return island


class Cluster:
  """Which islands are up (island -> its worker's generation), and the
  generations the GlobalClient asked their workers to build."""

  def __init__(self, up):
    self.up = dict(up)
    self.builds = []

  def build(self, generation, address, members):
    self.builds.append((generation, address, members))


@pytest.fixture
def make():
  made = []

  def make_(up):
    cluster = Cluster(up)
    g = GlobalClient(len(up), "127.0.0.1:0", lambda: dict(cluster.up),
                     cluster.build)
    made.append(g)
    return g, cluster
  yield make_
  for g in made:
    g.shutdown()


def test_generations_follow_the_islands_up(make):
  g, cluster = make({0: 0, 1: 0, 2: 0})
  first = g.address
  assert g.check([_island(0), _island(1)]) == 0
  assert not cluster.builds
  # Island 2 is lost: the two left build a global client of their own at
  # the first program spanning islands.
  del cluster.up[2]
  assert g.check([_island(0), _island(1)]) == 1
  ((generation, address, members),) = cluster.builds
  assert (generation, members) == (1, (0, 1)) and address != first
  assert g.check([_island(0), _island(1)]) == 1  # nothing new
  assert len(cluster.builds) == 1
  # A program over the lost island: left to fail with the loss.
  assert g.check([_island(1), _island(2)]) is None
  # Launches may be numbered while it is built: the workers wait for it.
  assert not g.member(_island(0))
  g.finished(1, Status())
  assert g.member(_island(0)) and g.member(_island(1))
  assert not g.member(_island(2))
  # Island 2's place taken: all three again, at once.
  cluster.up[2] = 1
  g.follow()
  assert [(b[0], b[2]) for b in cluster.builds[1:]] == [(2, (0, 1, 2))]
  assert g.check([_island(1), _island(2, 1)]) == 2
  g.finished(2, Status())
  assert g.member(_island(2, 1)) and not g.member(_island(2, 0))
  assert g.describe()["state"] == "ready"


def test_one_island_up_needs_no_global_client(make):
  g, cluster = make({0: 0, 1: 0})
  del cluster.up[1]
  assert g.follow() == {0: 0}
  assert not cluster.builds and g.generation == 0


def test_a_worker_not_in_the_generation_is_refused(make):
  g, _ = make({0: 0, 1: 0})
  # The program names a worker generation the islands up do not have (a
  # rejoin racing the check).
  with pytest.raises(StatusError) as e:
    g.check([_island(0), _island(1, 5)])
  assert e.value.status.code == Code.FAILED_PRECONDITION
  assert "island 1 (generation 5)" in e.value.status.message


def test_a_generation_that_failed_says_why_until_the_next(make):
  g, cluster = make({0: 0, 1: 0, 2: 0})
  del cluster.up[2]
  g.follow()
  g.finished(1, Status(Code.DEADLINE_EXCEEDED, "island 0 did not join"))
  with pytest.raises(StatusError) as e:
    g.check([_island(0), _island(1)])
  assert e.value.status.code == Code.UNAVAILABLE
  assert "island 0 did not join" in e.value.status.message
  cluster.up[2] = 1
  g.follow()
  g.finished(1, Status(Code.INTERNAL, "late news of generation 1"))
  assert g.check([_island(0), _island(1)]) == 2
