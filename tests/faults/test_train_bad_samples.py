"""Item 4 of issue 17: a bad sample never ends a run nor desynchronises the ranks.

Real faults: JPEGs overwritten with garbage (a whole batch of one rank), a file replaced by
a directory after the scan (reading it is an ``OSError``, as an NFS EIO is); real Redis,
real 2-rank gloo groups, the cached torch loader in worker processes and in-process.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from cachepipe import CacheConfig
from loaders import CachedImageFolder
from loaders.replacement import replacement_index
from loaders.sampler import BatchRequest, shard_indices
from tests.distributed import run_distributed
from trainer.launch import launch_local
from tests.faults.train_faults import copy_dataset, small_recipe, train_dataset, train_files  # noqa: F401
from trainer.run_config import RunConfig


def _train(rank, world, cfg):
    """Train; rank 0 returns its rows and every rank's step count."""
    import torch
    import torch.distributed as dist

    from trainer.loop import train

    rows = train(cfg)
    steps = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(steps, torch.tensor([rows[-1]["steps"]]))
    return rows, [int(s) for s in steps]


def _break_a_whole_batch(data, seed: int, batch: int) -> list:
    """Overwrite every file of rank 1's first batch of epoch 0 with garbage."""
    files = train_files(data)
    order = shard_indices(len(files), epoch=0, seed=seed, rank=1, world_size=2, shuffle=True, drop_last=True)
    bad = [files[i] for i in order[:batch]]
    for f in bad:
        f.write_bytes(b"\xff\xd8 not a JPEG any more")
    return bad


@pytest.mark.parametrize("cache", [False, True])
def test_an_unreadable_file_is_replaced_naming_it(train_dataset, tmp_path, cache):
    data = copy_dataset(train_dataset, tmp_path / "data")
    kwargs = dict(cache_dir=tmp_path / "cache", redis=False) if cache else dict(cache=False)
    folder = CachedImageFolder(data / "train", cache_size=36, on_error="skip", **kwargs)  # scanned here
    victim = train_files(data)[5]
    victim.unlink()
    victim.mkdir()  # reading it now fails with an OSError (IsADirectoryError), as an NFS EIO does
    request = BatchRequest([4, 5, 6], epoch=2, number=1, seed="0/2/0/1")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        samples, targets, skipped = folder.load_many(request)
    lines = [str(w.message) for w in seen if victim.name in str(w.message)]
    assert len(lines) == 1 and "Is a directory" in lines[0], lines  # one line, with what is wrong
    stand_in = replacement_index("0/2/0/1", 5, 0, len(folder))
    assert skipped == [5] and len(samples) == 3
    assert targets == [folder.targets[4], folder.targets[stand_in], folder.targets[6]]
    np.testing.assert_array_equal(samples[1], folder.load(stand_in))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # issue 32, item 17: one warning per file, not one per batch
        assert folder.load_many(request)[1] == targets  # the same draw: a resumed run rebuilds the same batch
    assert folder.skipped == [5, 5]  # still counted each time
    folder.close()


def test_a_rank_whose_whole_batch_is_bad_takes_the_same_steps(train_dataset, tmp_path, redis_server):
    data = copy_dataset(train_dataset, tmp_path / "data")
    recipe = small_recipe(epochs=1, **{"train.workers": 1})  # read in a DataLoader worker
    bad = _break_a_whole_batch(data, recipe.train.seed, 4)
    cfg = RunConfig(recipe=recipe, data=str(data), out=str(tmp_path / "run"),
                    cache=CacheConfig(data, tmp_path / "cache", (redis_server.url,)), nodes=1, local_size=2,
                    device="cpu", print_table=False)
    rows, steps = launch_local(_train, 2, cfg, local_size=2, timeout=240)  # workers: not daemonic
    # 48 samples / 2 ranks / batch 4: 6 full steps on both ranks, nothing dropped
    assert steps == [6, 6]
    assert rows[0]["skipped"] == len(bad)  # the table's skip column, summed over ranks
    cache = rows[0]["cache"]
    assert cache["l2_hits"] + cache["l1_hits"] + cache["source_reads"] == 48 + len(bad)  # + the stand-ins


def test_on_error_raise_ends_the_run_naming_the_file(train_dataset, tmp_path, redis_server):
    data = copy_dataset(train_dataset, tmp_path / "data")
    recipe = small_recipe(epochs=1)
    bad = _break_a_whole_batch(data, recipe.train.seed, 4)
    cfg = RunConfig(recipe=recipe, data=str(data), out=str(tmp_path / "run"),
                    cache=CacheConfig(data, tmp_path / "cache", (redis_server.url,)), nodes=1, local_size=2,
                    device="cpu", print_table=False, on_error="raise")
    with pytest.raises(AssertionError, match="CorruptSampleError") as info:
        run_distributed(_train, 2, cfg, timeout=120)
    assert any(f.name in str(info.value) for f in bad)


def test_on_error_is_validated():
    with pytest.raises(ValueError, match="--on-error"):
        RunConfig(recipe=small_recipe(), data="d", out="o", on_error="ignore")
