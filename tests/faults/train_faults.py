"""Shared helpers of the training-side fault tests: a small recipe, a private dataset copy."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tools.demo_dataset import make_dataset
from trainer.recipes import load_recipe, override

__all__ = ["train_dataset", "small_recipe", "copy_dataset", "train_files", "run_ranks"]


@pytest.fixture(scope="session")
def train_dataset(tmp_path_factory) -> Path:
    """4 classes, 12 training and 4 validation 40 px JPEGs per class (import it into a test module)."""
    return make_dataset(tmp_path_factory.mktemp("train_faults"), classes=4, per_class=12, val_per_class=4,
                        size=40, seed=0)


def small_recipe(epochs: int = 1, comm: str = "dense", **sets):
    """The demo recipe shrunk for tests: batch 4, 32 px crops from a 36 px cache, dense exchange
    unless ``comm`` says otherwise."""
    extra = [f"{k}={v}" for k, v in sets.items()]
    return override(load_recipe("demo"), epochs=epochs, comm=comm, batch_size=4, size=32,
                    sets=["train.cache_size=36", "train.eval_size=32", "schedule.warmup_epochs=0", *extra])


def copy_dataset(dataset: Path, dst: Path) -> Path:
    """A private, modifiable copy of a ``train/`` + ``val/`` dataset."""
    shutil.copytree(dataset, dst)
    return dst


def train_files(data: Path) -> list[Path]:
    """The training files in sample-index order (sorted classes, sorted files)."""
    return [f for c in sorted((data / "train").iterdir()) for f in sorted(c.iterdir())]


def run_ranks(fn, world_size: int, *args, report: tuple[int, ...], timeout: float = 120.0) -> dict:
    """Like ``tests.distributed.run_distributed``, for jobs in which some ranks die: only the
    ranks in ``report`` must return (their values, by rank); every process is reaped."""
    import queue as queue_module

    from tests.distributed import next_result, start_ranks

    procs, results = start_ranks(fn, world_size, args)
    values: dict = {}
    try:
        while set(report) - set(values):
            try:
                rank, ok, value = next_result(results, timeout)
            except queue_module.Empty:
                raise AssertionError(f"ranks {sorted(set(report) - set(values))} did not report in {timeout} s")
            if not ok:
                raise AssertionError(f"rank {rank} failed:\n{value}")
            values[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    return values

