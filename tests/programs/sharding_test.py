"""ShardingProto <-> Sharding <-> worker specs."""
import pytest

from jax_pathways.programs import sharding as sh
from jax_pathways.resources.topology import Topology
from jax_pathways.status import StatusError
from jax_pathways.wire import protos


def _tiled(*dims):
  op = protos.msg("xla.OpSharding")()
  op.type = 3
  op.tile_assignment_dimensions.extend(dims)
  op.iota_reshape_dims.append(4)
  op.iota_transpose_perm.append(0)
  return op


def test_hlo_round_trip_and_shard_shape():
  s = sh.Sharding((4, 5, 6, 7), _tiled(4, 1).SerializeToString(), "device")
  proto = protos.msg("xla.ifrt.ShardingProto")()
  sh.to_proto(s, proto)
  assert proto.serialized_sharding.type_name == sh.HLO
  back = sh.from_proto(proto)
  assert back == s
  assert s.shard_shape((10, 3)) == (3, 3)
  assert s.num_shards == 4


def test_single_device_and_replicated():
  s = sh.Sharding((2,))
  proto = protos.msg("xla.ifrt.ShardingProto")()
  sh.to_proto(s, proto)
  assert proto.serialized_sharding.type_name == sh.SINGLE_DEVICE
  assert sh.from_proto(proto) == s
  replicated = sh.from_op_sharding((0, 1), None, "device")
  assert replicated.op_sharding is None and replicated.shard_shape((5,)) == (5,)


def _topology():
  t = Topology(2)
  for i in range(2):
    t.register({"island": i, "num_devices": 4})
    t.connected(i)
  return t


def test_worker_spec_uses_local_indices_within_an_island():
  spec = sh.Sharding((6, 7), _tiled(2).SerializeToString()).worker_spec(
      _topology())
  assert spec["devices"] == [2, 3] and spec["op_sharding"]


def test_worker_spec_names_islands_when_spanning():
  spec = sh.Sharding((3, 4), _tiled(2).SerializeToString()).worker_spec(
      _topology())
  assert spec["devices"] == [[0, 3], [1, 0]]


def test_unsupported_sharding_is_a_clear_error():
  proto = protos.msg("xla.ifrt.ShardingProto")()
  proto.serialized_sharding.type_name = "xla::ifrt::OpaqueSharding"
  with pytest.raises(StatusError, match="OpaqueSharding is not supported"):
    sh.from_proto(proto)
  with pytest.raises(StatusError, match="onto 3 devices"):
    sh.Sharding((0, 1)).with_devices([1, 2, 3])


def test_reordered_keeps_each_device_on_its_piece():
  """Tiles [2, 4] laid out by an iota (4 x 2, transposed): tiles 0..7 on
  positions 0, 2, 4, 6, 1, 3, 5, 7. Over the devices reversed, each device
  keeps its tile."""
  op = protos.msg("xla.OpSharding")(
      type=3, tile_assignment_dimensions=[2, 4], iota_reshape_dims=[4, 2],
      iota_transpose_perm=[1, 0])
  devices = tuple(range(10, 18))
  s = sh.Sharding(devices, op.SerializeToString())
  turned = s.reordered(devices[::-1], [7 - p for p in range(8)])
  tiles = protos.msg("xla.OpSharding").FromString(turned.op_sharding)
  before = [0, 2, 4, 6, 1, 3, 5, 7]
  assert [turned.devices[q] for q in tiles.tile_assignment_devices] == [
      devices[p] for p in before]
  assert not tiles.iota_reshape_dims
  assert turned.shard_shape((8, 8)) == s.shard_shape((8, 8)) == (4, 2)


def test_reordered_refuses_tiles_outside_the_devices():
  op = protos.msg("xla.OpSharding")(
      type=3, tile_assignment_dimensions=[2], iota_reshape_dims=[1 << 40])
  with pytest.raises(StatusError, match="iota"):
    sh.Sharding((0, 1), op.SerializeToString()).reordered((1, 0), [1, 0])
