"""Environment variables: defaults and clear errors."""
import re

import pytest

from jax_pathways import config
from jax_pathways.status import StatusError


def test_defaults(monkeypatch):
  for name in (config.ISLANDS, config.DEVICES_PER_ISLAND, config.MAX_IN_FLIGHT,
               config.WORKER_TIMEOUT, config.PLATFORM,
               config.FIRST_MESSAGE_TIMEOUT):
    monkeypatch.delenv(name, raising=False)
  cfg = config.from_env()
  assert (cfg.islands, cfg.devices_per_island, cfg.max_in_flight,
          cfg.first_message_timeout, cfg.platform) == (2, 4, 16, 10.0, "cpu")
  assert cfg.worker_timeout is None  # the controller's 5 s


def test_bad_values_are_echoed(monkeypatch):
  monkeypatch.setenv(config.ISLANDS, "two")
  with pytest.raises(StatusError, match="JAX_PATHWAYS_ISLANDS='two'"):
    config.from_env()
  monkeypatch.setenv(config.ISLANDS, "2")
  monkeypatch.setenv(config.MAX_IN_FLIGHT, "64")
  with pytest.raises(StatusError, match="out of range 1..63"):
    config.from_env()


@pytest.mark.parametrize("name, good, field, value, bad, words", [
    (config.WORKER_TIMEOUT, "2.5", "worker_timeout", 2.5, "1",
     "JAX_PATHWAYS_WORKER_TIMEOUT=1.0 must be >= 2 seconds"),
    (config.PLATFORM, "cuda", "platform", "cuda", "cuda --devices 8",
     "JAX_PATHWAYS_PLATFORM='cuda --devices 8' is not a platform name"),
    (config.FIRST_MESSAGE_TIMEOUT, "0.5", "first_message_timeout", 0.5, "0",
     "JAX_PATHWAYS_FIRST_MESSAGE_TIMEOUT=0.0 must be positive"),
    (config.CLIENT_HEAP_KEEP_MB, "0", "client_heap_keep_mb", 0, "-1",
     "JAX_PATHWAYS_CLIENT_HEAP_KEEP_MB=-1 is out of range 0..1048576"),
])
def test_a_value_is_read_and_a_bad_one_refused_in_words(
    monkeypatch, name, good, field, value, bad, words):
  monkeypatch.setenv(name, good)
  assert getattr(config.from_env(), field) == value
  monkeypatch.setenv(name, bad)
  with pytest.raises(StatusError, match=re.escape(words)):
    config.from_env()


@pytest.mark.parametrize("raw, expected", [
    ("4096", 4096), ("64M", 64 << 20), ("2G", 2 << 30), ("2GiB", 2 << 30),
    (" 1.5k ", 1536), ("3T", 3 << 40)])
def test_sizes(raw, expected):
  assert config.parse_bytes(raw, "--device-memory") == expected


@pytest.mark.parametrize("raw", ["B", "  ", "", "64X", "M", "lots"])
def test_a_size_that_is_none_says_so(raw):
  with pytest.raises(StatusError, match=re.escape(
      f"--device-memory={raw!r} is not a size like 64M or 2G")):
    config.parse_bytes(raw, "--device-memory")
