"""Fixtures for speaking to the controller raw: sessions, the host-buffer
side channel, the fuzzer."""
from __future__ import annotations

import os
import sys
import types

import pytest

sys.path.insert(0, os.path.dirname(__file__))
# pylint: disable=wrong-import-position
import fuzz  # noqa: E402
import raw_client  # noqa: E402
from raw_client import RawSession  # noqa: E402


@pytest.fixture
def raw():
  """RawSession and Fuzzer, for tests that open their own sessions."""
  return types.SimpleNamespace(RawSession=RawSession, Fuzzer=fuzz.Fuzzer)


@pytest.fixture
def side_channel():
  """The host-buffer calls, raw: store, lookup, delete."""
  return types.SimpleNamespace(store=raw_client.store,
                               store_async=raw_client.store_async,
                               lookup=raw_client.lookup,
                               delete=raw_client.delete)


@pytest.fixture
def raw_session(pathways):
  """Opens RawSessions on the test cluster; closes them afterwards."""
  opened = []

  def open_one(token: str | None = None,
               devices: str | None = None) -> RawSession:
    session = RawSession(pathways.address,
                         pathways.token if token is None else token,
                         devices=devices)
    opened.append(session)
    return session

  yield open_one
  for session in opened:
    session.close()
