"""Paths a request names stay under the workers' storage root."""
from __future__ import annotations

import os

import pytest

from jax_pathways.status import Code, StatusError
from jax_pathways.storage import paths


def _denied(root, path, code=Code.PERMISSION_DENIED, match="outside"):
  with pytest.raises(StatusError, match=match) as e:
    paths.confine(root, path)
  assert e.value.status.code == code


def test_paths_under_the_root_are_files_there(tmp_path):
  root = tmp_path / "root"
  root.mkdir()
  assert paths.confine(str(root), f"{root}/ck/1/w") == {
      "driver": "file", "path": f"{root}/ck/1/w"}


def test_escapes_are_refused(tmp_path):
  root = tmp_path / "root"
  (root / "ck").mkdir(parents=True)
  (tmp_path / "elsewhere").mkdir()
  _denied(str(root), f"{tmp_path}/elsewhere/w")
  _denied(str(root), f"{root}/../elsewhere/w", Code.INVALID_ARGUMENT,
          "not a plain path")
  _denied(str(root) + "x", f"{root}/w")  # a sibling sharing its prefix
  # A link planted under the root, to a directory outside it.
  os.symlink(tmp_path / "elsewhere", root / "ck" / "link")
  _denied(str(root), f"{root}/ck/link/w", match="-> .*elsewhere/w")
  _denied(str(root), "gs://bucket/w")
  _denied(None, f"{root}/w", Code.FAILED_PRECONDITION, "no storage root")


def test_url_roots_hold_their_prefix_only():
  assert paths.confine("gs://bucket/ckpts", "gs://bucket/ckpts/a/w") == \
      "gs://bucket/ckpts/a/w"
  _denied("gs://bucket/ckpts", "gs://bucket/ckptsx/w")
  _denied("gs://bucket/ckpts", "s3://bucket/ckpts/w")
  _denied("gs://bucket/ckpts", "/local/w")
