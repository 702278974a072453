"""A small learnable dataset shared by the trainer tests (real JPEGs on disk)."""
from __future__ import annotations

import pytest

from tools.demo_dataset import make_dataset


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory):
    """4 classes, 12 training and 4 validation 40 px JPEGs per class."""
    return make_dataset(tmp_path_factory.mktemp("small_dataset"), classes=4, per_class=12, val_per_class=4,
                        size=40, seed=0)
