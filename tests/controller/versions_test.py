"""Protocol version negotiation never answers outside the client's range."""
import pytest

from jax_pathways.controller import versions
from jax_pathways.status import StatusError
from jax_pathways.wire import protos


def _v(protocol, serdes):
  v = protos.msg("xla.ifrt.proxy.IfrtProxyVersion")()
  v.protocol_version, v.ifrt_serdes_version_number = protocol, serdes
  return v


def test_jaxlib_0_10_2_range():
  assert versions.negotiate(_v(16, 0), _v(25, 3)) == (25, 3)


def test_older_client_gets_its_max():
  assert versions.negotiate(_v(16, 0), _v(20, 1)) == (20, 1)


def test_no_common_version():
  with pytest.raises(StatusError, match="share no protocol version"):
    versions.negotiate(_v(30, 0), _v(31, 3))
  with pytest.raises(StatusError, match="client offers \\[1, 12\\]"):
    versions.negotiate(_v(1, 0), _v(12, 3))
