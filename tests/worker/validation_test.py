"""The worker checks again what it maps into memory: hostile payloads fail
their op with a clear error and never reach numpy or PJRT unchecked."""
import jax
import numpy as np
import pytest

from jax_pathways.status import Code, StatusError
from jax_pathways.wire import payloads
from jax_pathways.worker.pjrt_backend import PjrtBackend, Program, host_view
from jax_pathways.worker.worker import Worker

DATA = np.arange(16, dtype=np.float32)


@pytest.mark.parametrize("shape,strides,words", [
    ([4, 4], [8, 1 << 40], "beyond the 64-byte host buffer"),
    ([1024], [4], "beyond the 64-byte host buffer"),
    ([1024], None, "needs 4096 bytes but the host buffer has 64"),
    ([4, 4], [-16, 4], "before the start"),
    ([4, 4], [4], "rank 2"),
    ([-4, -4], None, "negative dimension"),
    ([1 << 40, 1 << 40], None, "larger than"),
])
def test_put_of_a_hostile_payload_is_refused(shape, strides, words):
  with pytest.raises(StatusError) as e:
    host_view(memoryview(DATA.tobytes()), "float32", shape, strides)
  assert e.value.status.code == Code.INVALID_ARGUMENT
  assert words in e.value.status.message


def test_checks_kept_per_kind_of_view_still_refuse_each_time():
  """host_view keeps its checks per kind of view (dtype, shape, strides,
  size): the same view again is not checked again, but a refused one is
  refused every time, and one of another size is checked anew."""
  data = memoryview(DATA.tobytes())
  for _ in range(2):
    np.testing.assert_array_equal(host_view(data, "float32", [2, 8], None),
                                  DATA.reshape(2, 8))
    with pytest.raises(StatusError, match="needs 64 bytes"):
      host_view(data[:60], "float32", [2, 8], None)
    with pytest.raises(StatusError, match="needs 128 bytes"):
      host_view(data, "float32", [4, 8], None)


def test_put_with_legal_strides_is_a_view():
  payload = DATA.tobytes()
  view = host_view(memoryview(payload), "float32", [4, 4], [4, 16])
  np.testing.assert_array_equal(view, DATA.reshape(4, 4).T)


@pytest.mark.parametrize("strides", [[0, 0], [1 << 40, 4], [4], [12, 8]])
def test_fetch_with_hostile_strides_is_refused(cpu_devices, strides):
  array = jax.device_put(DATA[:6].reshape(2, 3), cpu_devices[0])
  with pytest.raises(StatusError) as e:
    PjrtBackend.to_host(array, strides)
  assert e.value.status.code == Code.INVALID_ARGUMENT
  assert "FETCH: byte_strides" in e.value.status.message


def test_fetch_with_dense_strides(cpu_devices):
  array = jax.device_put(DATA[:6].reshape(2, 3), cpu_devices[0])
  got = PjrtBackend.to_host(array, [4, 8]).view(np.float32)
  np.testing.assert_array_equal(got, DATA[:6].reshape(2, 3).T.reshape(-1))


def test_launch_with_the_wrong_arguments_is_refused(cpu_devices):
  """Checked before PJRT sees them: 0 arguments for a 2-device program
  crashed the worker."""
  program = Program(None, None, tuple(cpu_devices[:2]), [], {"name": "f"},
                    [((8,), np.dtype(np.float32), (4,))])
  # Nothing before the checks needs the backend's devices or clients.
  backend = PjrtBackend.__new__(PjrtBackend)
  sharding = jax.sharding.NamedSharding(
      jax.sharding.Mesh(np.array(cpu_devices[:2]), ("x",)),
      jax.sharding.PartitionSpec("x"))
  cases = [
      ([], "takes 1 arguments, not 0"),
      ([jax.device_put(np.zeros(4, np.float32), sharding)],
       "argument 0 is float32[4]"),
      ([jax.device_put(np.zeros(8, np.int32), sharding)],
       "argument 0 is int32[8]"),
      ([jax.device_put(np.zeros(8, np.float32), cpu_devices[0])],
       "on 1 devices, the program runs on 2"),
      ([jax.device_put(np.zeros(8, np.float32), jax.sharding.NamedSharding(
          sharding.mesh, jax.sharding.PartitionSpec()))],
       "comes in shards of (8,), the program takes shards of (4,)"),
  ]
  for args, words in cases:
    with pytest.raises(ValueError) as e:
      backend.execute(program, args)
    assert words in str(e.value)


class _Backend:
  """Just what Worker._put asks of a backend before it maps a shard."""

  def __init__(self, devices):
    self._sharding = type("S", (), {"_device_assignment": tuple(devices)})()

  def sharding(self, spec):
    return self._sharding

  def mine(self, sharding):
    return list(sharding._device_assignment)  # pylint: disable=protected-access


@pytest.mark.parametrize("shards,blobs,words", [
    ([{"devices": [-1], "dtype": "float32", "shape": [8]}], 1,
     "shard device index -1 out of range"),
    ([{"devices": [0], "dtype": "float32", "shape": [8]},
      {"devices": [1], "dtype": "float32", "shape": [8]}], 1,
     "1 blobs for 2 shards"),
])
def test_put_of_hostile_shards_is_refused(cpu_devices, shards, blobs, words):
  worker = Worker.__new__(Worker)  # no executor or threads: _put only
  worker._backend = _Backend(cpu_devices[:2])  # pylint: disable=protected-access
  worker._headers = {}  # pylint: disable=protected-access
  payload = payloads.encode({"dtype": "float32", "shape": [16],
                             "sharding": {}, "shards": shards},
                            *[DATA[:8].tobytes()] * blobs)
  op = type("Op", (), {"payload": payload, "results": [1], "seq": 1})()
  with pytest.raises(StatusError) as e:
    worker._put(op)  # pylint: disable=protected-access
  assert e.value.status.code == Code.INVALID_ARGUMENT
  assert words in e.value.status.message
