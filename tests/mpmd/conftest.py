"""Fixtures for the mpmd tests: the MLP of models.py."""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import models  # noqa: E402  pylint: disable=wrong-import-position


@pytest.fixture
def mlp() -> Callable[..., models.Mlp]:
  return models.make_mlp


@pytest.fixture
def rel_err() -> Callable[[Any, Any], float]:
  return models.relative_error
