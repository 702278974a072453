"""Fixtures for the loader tests: private copies of the tiny dataset and cache dirs whose
embedded Redis is stopped at teardown."""
from __future__ import annotations

import shutil

import pytest

from cachepipe.embedded import EmbeddedRedis


@pytest.fixture
def source(tiny_dataset, tmp_path):
    """A private, modifiable copy of ``tiny_dataset/train`` (4 classes x 6 JPEGs of ~48 px)."""
    dst = tmp_path / "src"
    shutil.copytree(tiny_dataset / "train", dst)
    return dst


@pytest.fixture
def cache_dir(tmp_path):
    """A cache directory; its embedded Redis (if a test started one) is stopped after."""
    path = tmp_path / "cache"
    yield path
    EmbeddedRedis(path).stop()

