"""ShardingProto <-> Sharding <-> worker specs."""
import pytest

from jax_pathways import protos
from jax_pathways.programs import sharding as sh
from jax_pathways.resources.topology import Topology
from jax_pathways.status import StatusError


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
