"""Persistence requests as pathwaysutils builds them, and hostile ones."""
from __future__ import annotations

import base64
import copy
import datetime
import json

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from pathwaysutils.persistence import helper

from jax_pathways.programs.sharding import Sharding
from jax_pathways.status import Code, StatusError
from jax_pathways.storage import requests

TIMEOUT = datetime.timedelta(seconds=90, milliseconds=500)


@pytest.fixture(scope="module")
def mesh(cpu_devices) -> Mesh:
  return Mesh(np.array(cpu_devices).reshape(2, 4), ("data", "model"))


def _parse(text: str) -> requests.PersistenceRequest:
  body = json.loads(text)
  (kind, value), = body.items()
  return requests.parse(kind, value)


def test_a_bulk_write_as_pathwaysutils_sends_it(mesh):
  x = jax.device_put(np.zeros((16, 8), np.float32),
                     NamedSharding(mesh, P("data", "model")))
  y = jax.device_put(np.zeros(3, np.int32), NamedSharding(mesh, P()))
  got = _parse(helper.get_bulk_write_request("/ck/1", ["params.w", "step"],
                                             [x, y], TIMEOUT))
  assert got.write
  w, s = got.arrays
  assert (w.location, w.name, w.path) == ("/ck/1", "params.w",
                                          "/ck/1/params.w")
  assert (w.shape, w.dtype, w.timeout_s) == ((16, 8), None, 90.5)
  assert w.sharding.devices == tuple(d.id for d in mesh.devices.flat)
  assert w.sharding.shard_shape((16, 8)) == (8, 2)
  assert s.sharding == Sharding(w.sharding.devices)  # replicated: whole


def test_a_bulk_read_as_orbax_sends_it(mesh):
  text = helper.get_bulk_read_request(
      "/ck/2/", ["a", "b"], [np.dtype("bfloat16"), np.dtype("uint8")],
      [(8, 4), ()], [NamedSharding(mesh, P(None, "data")),
                     NamedSharding(mesh, P())], mesh.devices, TIMEOUT)
  a, b = _parse(text).arrays
  assert (a.location, a.dtype, a.shape) == ("/ck/2", "bfloat16", (8, 4))
  assert a.sharding.shard_shape((8, 4)) == (8, 2)
  assert (b.dtype, b.shape) == ("uint8", ())


def _one_write(mesh) -> dict:
  x = jax.device_put(np.zeros((4, 8), np.float32),
                     NamedSharding(mesh, P(None, "model")))
  return json.loads(helper.get_write_request("/ck", "x", x, TIMEOUT))


def _b64(text: str) -> str:
  return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize("change, code, match", [
    (lambda r: r.update(b64_location=_b64("relative/dir")),
     Code.INVALID_ARGUMENT, "neither an absolute path"),
    (lambda r: r.update(b64_name=_b64("../../etc/passwd")),
     Code.INVALID_ARGUMENT, "not a plain path"),
    (lambda r: r.update(b64_name=_b64("/etc/passwd")),
     Code.INVALID_ARGUMENT, "must be a relative path"),
    (lambda r: r.update(b64_name=_b64("a\0b")), Code.INVALID_ARGUMENT,
     "no NUL"),
    (lambda r: r.update(b64_name="***"), Code.INVALID_ARGUMENT,
     "not base64"),
    (lambda r: r.update(shape=[1 << 30, 1 << 30]), Code.INVALID_ARGUMENT,
     "elements in all"),
    (lambda r: r.update(shape=[-1, 8]), Code.INVALID_ARGUMENT, "sizes"),
    (lambda r: r.update(shape=[[[[]]]]), Code.INVALID_ARGUMENT, "sizes"),
    (lambda r: r.update(shape=[1] * 65), Code.INVALID_ARGUMENT, "at most 64"),
    (lambda r: r.update(devices={"device_ids": []}), Code.INVALID_ARGUMENT,
     "device_ids"),
    (lambda r: r.update(devices={"device_ids": [0, 0, 1, 2, 3, 4, 5, 6]}),
     Code.INVALID_ARGUMENT, "more than once"),
    (lambda r: r.update(b64_hlo_sharding_string=_b64("not a proto")),
     Code.INVALID_ARGUMENT, "OpSharding"),
    (lambda r: r.update(timeout={"seconds": -5}), Code.INVALID_ARGUMENT,
     "timeout"),
    (lambda r: r.update(timeout={"seconds": 0}), Code.INVALID_ARGUMENT,
     "above 0"),
    (lambda r: r.update(extra=1), Code.INVALID_ARGUMENT, "with the fields"),
])
def test_a_hostile_write_is_refused_by_name(mesh, change, code, match):
  request = _one_write(mesh)
  change(request["persistenceWriteRequest"])
  with pytest.raises(StatusError, match=match) as e:
    _parse(json.dumps(request))
  assert e.value.status.code == code


def test_bulk_requests_are_bounded_and_named_once(mesh):
  one = _one_write(mesh)["persistenceWriteRequest"]
  with pytest.raises(StatusError, match="names '/ck/x' twice"):
    requests.parse(requests.BULK_WRITE, {"write_requests": [one, one]})
  with pytest.raises(StatusError, match="must list 1 to"):
    requests.parse(requests.BULK_WRITE, {"write_requests": []})
  with pytest.raises(StatusError, match="one field"):
    requests.parse(requests.BULK_READ, {"write_requests": [one]})
  read = copy.deepcopy(one)
  read["shape"] = {"xla_primitive_type_str": "F99", "dimensions": [4, 8]}
  with pytest.raises(StatusError, match="'F99' is not one of"):
    requests.parse(requests.READ, read)


def test_what_jax_pathways_writes_reads_back_as_pathwaysutils_would(mesh):
  """requests.bulk (jax_pathways' own client: elastic commits) writes what
  pathwaysutils writes, field for field."""
  x = jax.device_put(np.zeros((16, 8), np.float32),
                     NamedSharding(mesh, P("data", "model")))
  ours = requests.bulk(True, "/ck/1", [{
      "name": "w", "shape": x.shape, "dtype": None,
      "op_sharding": x.sharding._to_xla_hlo_sharding(2).to_proto()  # pylint: disable=protected-access
                     .SerializeToString(),
      "device_ids": [d.id for d in mesh.devices.flat]}], 90.5)
  assert json.loads(ours) == json.loads(helper.get_bulk_write_request(
      "/ck/1", ["w"], [x], TIMEOUT))
  read = _parse(requests.bulk(False, "/ck/1", [{
      "name": "w", "shape": (16, 8), "dtype": "bfloat16",
      "op_sharding": b"", "device_ids": [0, 1]}], 5.0))
  assert (read.arrays[0].dtype, read.arrays[0].sharding) == (
      "bfloat16", Sharding((0, 1)))
