"""Shared fixtures: real Redis servers, tiny JPEG datasets, GPU/DALI/triton availability."""
from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

# NOTE [one intra-op thread in tests]: two xdist workers, their training subprocesses and
# gloo ranks already keep both cores of a small CI box busy; a second torch thread in each
# only adds OpenMP barriers that wait for a descheduled thread (NOTE [single-threaded
# scan]): a tiny training run then takes 2-3x the wall time and twice the CPU. Set before
# torch is imported; subprocesses inherit it, and ``cachepipe train --threads 0`` reads it.
# A test about thread counts sets its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


# NOTE [Triton interpreter in tests]: without a GPU, the Triton kernels run in Triton's
# interpreter on CPU tensors, so CI checks their logic, masking, atomics and counts.
# triton.jit reads TRITON_INTERPRET when a kernel is decorated, so it is set here,
# before any test module imports triton (torch itself does not). Subprocesses inherit
# it; only kernel="gpu" looks at it, "auto" never picks the interpreter.
HAS_TRITON = importlib.util.find_spec("triton") is not None
if HAS_TRITON and not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cachepipe.server.embedded import EmbeddedRedis
from tests.redis_servers import private_redis
from tools.demo_dataset import make_dataset


@pytest.fixture
def redis_servers(tmp_path):
    """Factory: ``redis_servers(n, maxmemory=None, policy="noeviction")`` -> ``n`` started
    servers on 127.0.0.1 (:class:`cachepipe.server.process.RedisProcess`: ``url``,
    ``port``, ``client()``, ``kill()``, ``start()`` again after a kill).

    Every server is killed at teardown.
    """
    started: list = []

    def start(n: int = 1, **kwargs) -> list:
        new = [private_redis(tmp_path / f"redis{len(started) + i}", **kwargs) for i in range(n)]
        started.extend(new)
        return new

    yield start
    for server in started:
        server.kill()


@pytest.fixture
def redis_server(redis_servers):
    """One real redis-server."""
    return redis_servers(1)[0]


@pytest.fixture
def shm_url():
    """``shm:///dev/shm/cachepipe-test-<random>``: a node-local L2 store of this test alone
    (a directory not made yet, as after a reboot), removed at teardown."""
    import uuid

    path = Path("/dev/shm") / f"cachepipe-test-{uuid.uuid4().hex[:12]}"
    yield f"shm://{path}"
    shutil.rmtree(path, ignore_errors=True)


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


# NOTE [slow files first]: ``pytest -n 2 --dist loadfile`` hands whole files to the two
# workers one at a time as each finishes its last. xdist orders them by their count of
# tests unless ``--no-loadscope-reorder`` (pyproject's addopts) keeps the collection order,
# which puts the slowest files first: they run while the short files fill the gaps on the
# other worker (longest job first), so no worker is still on a 20-second file of a few
# tests while the other has nothing left. Order within a file is unchanged. The list is
# the slowest files of ``--durations`` by their total (docs/benchmarks/history/test-suite.md, test suite time).
SLOW_FILES = ("tests/comm/test_topk_gpu.py", "tests/trainer/test_training.py", "tests/faults/test_train_rank_killed.py",
              "tests/trainer/test_cli.py", "tests/tools/test_bench_train_emulated.py",
              "tests/faults/test_train_launcher_signals.py", "tests/faults/test_cache_server.py",
              "tests/tools/test_emulated_job.py", "tests/tools/test_bench_memory.py", "tests/loaders/test_dali.py",
              "tests/comm/test_auto.py", "tests/cachepipe/test_placement.py")


def pytest_collection_modifyitems(config, items):
    first = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: first.get(item.nodeid.split("::")[0], len(first)))  # stable
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is present")
    skip_dali = pytest.mark.skip(reason="needs nvidia-dali: pip install 'cachepipe[dali]'")
    skip_triton = pytest.mark.skip(reason="needs triton (pip install 'cachepipe[dev]') and a CUDA GPU "
                                          "or TRITON_INTERPRET=1")
    has_gpu = _has_cuda()
    has_triton = HAS_TRITON and (has_gpu or os.environ.get("TRITON_INTERPRET") == "1")
    from cachepipe.slowfs.mount import fuse_missing

    no_fuse = fuse_missing()
    skip_fuse = pytest.mark.skip(reason=f"needs FUSE: {no_fuse}")
    has_dali = importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip_gpu)
        if "triton" in item.keywords and not has_triton:
            item.add_marker(skip_triton)
        if "dali" in item.keywords and not has_dali:
            item.add_marker(skip_dali)
        if "fuse" in item.keywords and no_fuse:
            item.add_marker(skip_fuse)
