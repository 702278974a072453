"""Shared fixtures: real Redis servers, tiny JPEG datasets, GPU/DALI availability."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from cachepipe.demo_data import make_dataset
from cachepipe.embedded import EmbeddedRedis
from tests.redis_servers import RedisServer


@pytest.fixture
def redis_servers(tmp_path):
    """Factory: ``redis_servers(n, maxmemory=None)`` -> list of started RedisServer.

    Every server is killed at teardown.
    """
    started: list[RedisServer] = []

    def start(n: int = 1, **kwargs) -> list[RedisServer]:
        new = [RedisServer(tmp_path / f"redis{len(started) + i}", **kwargs) for i in range(n)]
        started.extend(new)
        return new

    yield start
    for server in started:
        server.kill()


@pytest.fixture
def redis_server(redis_servers):
    """One real redis-server."""
    return redis_servers(1)[0]


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> Path:
    """A 4-class ImageNet-layout JPEG dataset (``train/``: 6 per class, ``val/``: 2)."""
    root = tmp_path_factory.mktemp("tiny_dataset")
    return make_dataset(root, classes=4, per_class=6, val_per_class=2, size=48, seed=0)


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


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is present")
    skip_dali = pytest.mark.skip(reason="needs nvidia-dali: pip install 'cachepipe[dali]'")
    has_gpu = _has_cuda()
    has_dali = importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip_gpu)
        if "dali" in item.keywords and not has_dali:
            item.add_marker(skip_dali)
