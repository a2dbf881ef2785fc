"""GlobalClient: which workers may run programs spanning islands, generation
by generation, following the islands that are up (real jaxlib coordination
services, on loopback; the controller's side faked)."""
import subprocess
import sys
import threading
import time

import pytest

from jax_pathways.controller.coordination import CoordinationHost, GlobalClient
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
  assert g.describe()["state"] == "waiting"
  # Every island up (the controller calls follow() once all have joined):
  # their workers build generation 0 at the first service.
  first = g.describe()["address"]
  assert g.follow() == {0: 0, 1: 0, 2: 0}
  assert cluster.builds == [(0, first, (0, 1, 2))]
  assert g.check([_island(0), _island(1)]) == 0
  assert not g.member(_island(0)) and g.describe()["state"] == "joining"
  g.finished(0, Status())
  assert g.member(_island(0)) and len(cluster.builds) == 1
  # Island 2 is lost: the two left build a global client of their own
  # (at the first program spanning islands, if nothing called follow()).
  del cluster.up[2]
  assert g.check([_island(0), _island(1)]) == 1
  (generation, address, members) = cluster.builds[1]
  assert (generation, members) == (1, (0, 1)) and address != first
  assert g.check([_island(0), _island(1)]) == 1  # nothing new
  assert len(cluster.builds) == 2
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
  assert [(b[0], b[2]) for b in cluster.builds[2:]] == [(2, (0, 1, 2))]
  assert g.check([_island(1), _island(2, 1)]) == 2
  g.finished(2, Status())
  assert g.member(_island(2, 1)) and not g.member(_island(2, 0))
  assert g.describe()["state"] == "ready"


def test_the_first_generation_waits_for_every_island(make):
  g, cluster = make({0: 0, 1: 0, 2: 0})
  first = g.describe()["address"]
  del cluster.up[2]  # its worker has not joined, or was lost before
  assert g.follow() == {0: 0, 1: 0}
  assert not cluster.builds
  with pytest.raises(StatusError) as e:
    g.check([_island(0), _island(1)])
  assert e.value.status.code == Code.UNAVAILABLE
  assert ("built once all 3 islands' workers are up (up: [0, 1])"
          in e.value.status.message)
  # Island 2's (next) worker is up: generation 0, at the service made for
  # it, which no worker has used yet.
  cluster.up[2] = 1
  g.follow()
  assert cluster.builds == [(0, first, (0, 1, 2))]
  assert g.check([_island(1), _island(2, 1)]) == 0


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
  g.follow()
  g.finished(0, Status())
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


# A worker's agent: connects, then answers each line on stdin with whether
# its service still serves it (a key-value write).
AGENT = """
import sys
from jaxlib import _jax
client = _jax.get_distributed_runtime_client(sys.argv[1], 0, init_timeout=60,
                                             shutdown_on_destruction=False)
client.connect()
print("connected", flush=True)
for n, _ in enumerate(sys.stdin):
  try:
    client.key_value_set(f"k{n}", "v")
    print("served", flush=True)
  except Exception as e:
    print(type(e).__name__, flush=True)
"""


def test_the_services_stay_until_their_agents_have_left(tmp_path):
  """A clean stop ends the services only once no worker's agent is
  connected: jaxlib's agent aborts its process (SIGABRT) when its service
  goes first, which a stop during a generation's build did to a worker in
  CI. The agent here is a process of its own, as a worker's is."""
  host = CoordinationHost()
  address = f"unix:{tmp_path}/coordination.sock"
  agent = None
  try:
    host.serve(address, 1)
    agent = subprocess.Popen([sys.executable, "-c", AGENT, address],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    assert agent.stdout.readline() == "connected\n"
    stopping = threading.Thread(target=host.close)
    stopping.start()
    time.sleep(0.5)  # the stop under way (the service shut down at once)
    agent.stdin.write("\n")
    agent.stdin.flush()
    assert agent.stdout.readline() == "served\n"
    assert stopping.is_alive()
    agent.kill()  # the worker leaves: then the services go
    stopping.join(timeout=30)  # hang guard
    assert not stopping.is_alive()
    assert host._proc.returncode == 0  # pylint: disable=protected-access
  finally:
    host._proc.kill()  # pylint: disable=protected-access
    if agent is not None:
      agent.kill()
      agent.wait(timeout=10)
