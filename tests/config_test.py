"""Environment variables: defaults and clear errors."""
import pytest

from jax_pathways import config
from jax_pathways.status import StatusError


def test_defaults(monkeypatch):
  for name in (config.ISLANDS, config.DEVICES_PER_ISLAND, config.MAX_IN_FLIGHT):
    monkeypatch.delenv(name, raising=False)
  cfg = config.from_env()
  assert (cfg.islands, cfg.devices_per_island, cfg.max_in_flight) == (2, 4, 16)


def test_bad_values_are_echoed(monkeypatch):
  monkeypatch.setenv(config.ISLANDS, "two")
  with pytest.raises(StatusError, match="JAX_PATHWAYS_ISLANDS='two'"):
    config.from_env()
  monkeypatch.setenv(config.ISLANDS, "2")
  monkeypatch.setenv(config.MAX_IN_FLIGHT, "64")
  with pytest.raises(StatusError, match="out of range 1..63"):
    config.from_env()


def test_worker_timeout(monkeypatch):
  monkeypatch.delenv(config.WORKER_TIMEOUT, raising=False)
  assert config.from_env().worker_timeout is None  # the controller's 5 s
  monkeypatch.setenv(config.WORKER_TIMEOUT, "2.5")
  assert config.from_env().worker_timeout == 2.5
  monkeypatch.setenv(config.WORKER_TIMEOUT, "1")
  with pytest.raises(StatusError, match="JAX_PATHWAYS_WORKER_TIMEOUT=1.0 "
                     "must be >= 2 seconds"):
    config.from_env()


def test_platform(monkeypatch):
  monkeypatch.delenv(config.PLATFORM, raising=False)
  assert config.from_env().platform == "cpu"
  monkeypatch.setenv(config.PLATFORM, "cuda")
  assert config.from_env().platform == "cuda"
  monkeypatch.setenv(config.PLATFORM, "cuda --devices 8")
  with pytest.raises(StatusError, match="JAX_PATHWAYS_PLATFORM='cuda --devices "
                     "8' is not a platform name"):
    config.from_env()


def test_first_message_timeout(monkeypatch):
  monkeypatch.delenv(config.FIRST_MESSAGE_TIMEOUT, raising=False)
  assert config.from_env().first_message_timeout == 10.0
  monkeypatch.setenv(config.FIRST_MESSAGE_TIMEOUT, "0.5")
  assert config.from_env().first_message_timeout == 0.5
  monkeypatch.setenv(config.FIRST_MESSAGE_TIMEOUT, "0")
  with pytest.raises(StatusError, match="JAX_PATHWAYS_FIRST_MESSAGE_TIMEOUT=0.0 "
                     "must be positive"):
    config.from_env()
