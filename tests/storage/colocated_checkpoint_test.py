"""orbax's COLOCATED_PYTHON checkpointing through the islands' colocated
processes, as users write it: each island's process writes and reads its
own shards with tensorstore (OCDBT on and off), no byte through this
process; plain orbax in one process reads what they wrote."""
from __future__ import annotations

import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh

import checkpoints
import state

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def mesh(pathways) -> Mesh:
  return Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))


@pytest.fixture
def colocated_handlers():
  with checkpoints.pathways_handlers(
      ocp.pathways.CheckpointingImpl.COLOCATED_PYTHON):
    yield


@pytest.mark.parametrize("ocdbt", [False, True])
def test_orbax_saves_and_restores_in_the_colocated_processes(
    tmp_path, mesh, colocated_handlers, ocdbt):
  values = state.values()
  manager = ocp.CheckpointManager(
      tmp_path, options=ocp.CheckpointManagerOptions(
          enable_async_checkpointing=True),
      item_handlers=ocp.PyTreeCheckpointHandler(use_ocdbt=ocdbt))
  manager.save(1, args=ocp.args.PyTreeSave(
      checkpoints.put(values, mesh, "saved")))
  manager.wait_until_finished()
  written = os.listdir(tmp_path / "1" / "default")
  # With OCDBT each island's process wrote its own store (named by its
  # process_index), which orbax then merged.
  assert ("ocdbt.process_1" in written) == ocdbt, written
  everything = dict.fromkeys(values, True)
  assert checkpoints.restore(tmp_path, mesh) == everything
  assert checkpoints.plain("read", str(tmp_path)) == everything


def test_a_client_capped_below_its_state_saves_and_restores_it(
    pathways, tmp_path):
  """As persistence_test's capped client, through colocated_python."""
  assert checkpoints.capped(pathways, tmp_path, 512, 384,
                            "COLOCATED_PYTHON") == {
      "equal": True, "could_hold_state": False,
      "restored_sharding_same": True}
