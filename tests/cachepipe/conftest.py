"""Fixtures for the cache tests: private copies of the tiny dataset and cache dirs whose
embedded Redis is stopped at teardown."""
from __future__ import annotations

import io
import shutil

import numpy as np
import pytest
from PIL import Image

from cachepipe.embedded import EmbeddedRedis


@pytest.fixture
def source(tiny_dataset, tmp_path):
    """A private, modifiable copy of ``tiny_dataset/train`` (4 classes x 6 JPEGs)."""
    dst = tmp_path / "src"
    shutil.copytree(tiny_dataset / "train", dst)
    return dst


@pytest.fixture
def cache_dir(tmp_path):
    """A cache directory; its embedded Redis (if any test started one) is stopped after."""
    path = tmp_path / "cache"
    yield path
    EmbeddedRedis(path).stop()


def reference_pixels(data: bytes, size: int) -> np.ndarray:
    """Plain Pillow decode + resize of the shorter side to ``size`` (the test's oracle)."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = img.size
    if w <= h:
        nw, nh = size, int(size * h / w)
    else:
        nw, nh = int(size * w / h), size
    return np.asarray(img.resize((nw, nh), Image.Resampling.BILINEAR))


def truncate(path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
