"""cached_dataloader with real Redis servers and worker processes: determinism, progressive
resizing, mid-epoch resume, a shard lost mid-epoch, corrupt samples."""
from __future__ import annotations

import gc
import os
import warnings

import pytest
import torch

from cachepipe import CacheWarning, CorruptSampleError, TwoLevelCache
from loaders import cached_dataloader
from loaders.replacement import replacement_index
from loaders.sampler import shard_indices

SMALL = dict(cache_size=40, size=32)


def run_epoch(loader, epoch):
    loader.set_epoch(epoch)
    return [(x.clone(), y.clone()) for x, y in loader]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(ya, yb)
        torch.testing.assert_close(xa, xb, rtol=0, atol=0)


def test_workers_with_redis_match_in_process_loading(source, cache_dir, redis_server):
    kwargs = dict(batch_size=5, train=True, cache_dir=cache_dir, redis=[redis_server.url], seed=3, **SMALL)
    multi = cached_dataloader(source, workers=2, **kwargs)
    single = cached_dataloader(source, workers=0, **kwargs)
    try:
        targets = multi.dataset.targets
        for epoch in (0, 1):
            got = run_epoch(multi, epoch)
            assert len(got) == len(multi) == 24 // 5  # drop_last for training
            for x, y in got:
                assert x.shape == (5, 3, 32, 32) and x.dtype == torch.float32 and y.dtype == torch.int64
            order = shard_indices(24, epoch=epoch, seed=3, rank=0, world_size=1, shuffle=True, drop_last=True)
            assert torch.cat([y for _, y in got]).tolist() == [targets[i] for i in order[:20]]
            # augmentation depends on (seed, epoch, batch), not on which process made the batch
            assert_same_batches(got, run_epoch(single, epoch))
        assert multi.cache_wait_s > 0
        assert redis_server.client().dbsize() == 24  # every sample is now in L2
        # reads made in the workers are counted: 2 epochs x 20 samples, each from some level;
        # epoch 1 finds in L2 what epoch 0 read (samples dropped by drop_last in epoch 0 miss)
        hits = multi.cache_hits
        assert hits["l2_hits"] + hits["l1_hits"] + hits["source_reads"] == 40
        assert hits["source_reads"] >= 20 and hits["l2_hits"] >= 16
        assert multi.dataset.cache.stats()["l2_hits"] == 0  # none of them in this process
    finally:
        multi.close()
        single.close()


def test_set_size_reaches_persistent_workers(source, cache_dir):
    loader = cached_dataloader(source, batch_size=6, train=True, workers=2, cache_dir=cache_dir, redis=False,
                               **SMALL)
    try:
        assert {tuple(x.shape[-2:]) for x, _ in run_epoch(loader, 0)} == {(32, 32)}
        workers = loader.loader._iterator._workers
        loader.set_size(24)
        assert {tuple(x.shape[-2:]) for x, _ in run_epoch(loader, 1)} == {(24, 24)}
        assert loader.loader._iterator._workers is workers  # same processes, no rebuild
        assert loader.size == 24 and loader.state_dict()["size"] == 24
    finally:
        loader.close()


def test_resume_mid_epoch_yields_exactly_the_remaining_batches(source, cache_dir, redis_server):
    kwargs = dict(batch_size=3, train=True, cache_dir=cache_dir, redis=[redis_server.url], seed=7, **SMALL)
    first = cached_dataloader(source, workers=2, **kwargs)
    try:
        reference = run_epoch(first, 4)
        first.set_epoch(4)
        seen = []
        for batch in first:
            seen.append(batch)
            if len(seen) == 3:
                state = first.state_dict()
                break
    finally:
        first.close()
    assert state["epoch"] == 4 and state["batches_done"] == 3
    resumed = cached_dataloader(source, workers=0, **kwargs)
    resumed.load_state_dict(state)
    resumed.set_epoch(4)  # what a training loop does at the top of the epoch: keeps the position
    rest = [(x.clone(), y.clone()) for x, y in resumed]
    assert_same_batches(seen + rest, reference)
    assert_same_batches(run_epoch(resumed, 5)[:1], run_epoch(resumed, 5)[:1])  # next epoch is whole again
    assert len(run_epoch(resumed, 5)) == len(resumed) == 8


def test_validation_loader_keeps_order_and_the_last_partial_batch(source, cache_dir):
    loader = cached_dataloader(source, batch_size=5, train=False, workers=0, cache_dir=cache_dir, redis=False,
                               **SMALL)
    got = run_epoch(loader, 0)
    assert [len(y) for _, y in got] == [5, 5, 5, 5, 4]
    assert torch.cat([y for _, y in got]).tolist() == loader.dataset.targets
    assert_same_batches(got, run_epoch(loader, 9))  # validation does not reshuffle


def test_shard_killed_during_iteration_degrades_to_l1_and_keeps_order(source, cache_dir, redis_servers):
    shards = redis_servers(2)
    urls = [s.url for s in shards]
    kwargs = dict(batch_size=4, train=True, cache_dir=cache_dir, redis=urls, seed=1, **SMALL)
    with TwoLevelCache(source, cache_dir, redis=urls, cache_size=40) as cache:  # warm L1 and both shards
        cache.get_many(range(24))
    assert all(s.client().dbsize() > 0 for s in shards)
    loader = cached_dataloader(source, workers=0, **kwargs)
    reference = run_epoch(loader, 2)
    loader.set_epoch(2)
    got = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in loader:
            got.append((x.clone(), y.clone()))
            if len(got) == 1:
                shards[0].kill()
    assert_same_batches(got, reference)
    assert any(issubclass(w.category, CacheWarning) and "shard" in str(w.message) for w in caught)
    assert loader.dataset.cache.stats()["l1_hits"] > 0


def test_shard_killed_while_workers_run(source, cache_dir, redis_servers):
    shards = redis_servers(2)
    kwargs = dict(batch_size=4, train=True, cache_dir=cache_dir, redis=[s.url for s in shards], seed=1, **SMALL)
    loader = cached_dataloader(source, workers=2, **kwargs)
    try:
        reference = run_epoch(loader, 0)  # also fills L1 and L2
        loader.set_epoch(0)
        got = []
        for x, y in loader:
            got.append((x.clone(), y.clone()))
            if len(got) == 1:
                shards[1].kill()
        assert_same_batches(got, reference)
    finally:
        loader.close()


def test_corrupt_samples_through_the_loader(source, cache_dir):
    bad = sorted((source / "class_0002").iterdir())[0]
    bad.write_bytes(b"\xff\xd8 truncated")
    skip = cached_dataloader(source, batch_size=8, train=False, workers=2, cache_dir=cache_dir, redis=False,
                             on_error="skip", **SMALL)
    try:
        labels = torch.cat([y for _, y in run_epoch(skip, 0)])
        bad_index = [p for p, _ in skip.dataset.samples].index(str(bad))
        assert len(labels) == 24 and skip.skipped == [bad_index]  # replaced: NOTE [replacing bad samples]
        stand_in = replacement_index(f"0/0/0/{bad_index // 8}", bad_index, 0, 24)
        assert labels[bad_index] == skip.dataset.targets[stand_in]
    finally:
        skip.close()
    strict = cached_dataloader(source, batch_size=8, train=False, workers=2, cache_dir=cache_dir, redis=False,
                               **SMALL)
    try:
        with pytest.raises(CorruptSampleError, match=bad.name):  # re-raised from the worker, same type
            run_epoch(strict, 0)
    finally:
        strict.close()


def test_embedded_redis_default_and_explicit_ranks(source, cache_dir):
    loaders = [cached_dataloader(source, batch_size=2, train=True, workers=0, cache_dir=cache_dir,
                                 distributed=(rank, 4), **SMALL) for rank in range(4)]
    labels = [torch.cat([y for _, y in run_epoch(ld, 0)]) for ld in loaders]
    assert all(len(ld) == 3 for ld in loaders) and sum(len(t) for t in labels) == 24
    assert loaders[0].dataset.cache.stats()["l2_writes"] > 0  # the embedded server was started and used
    with pytest.raises(ValueError, match="rank"):
        cached_dataloader(source, batch_size=2, train=True, workers=0, cache=False, distributed=(4, 4))


def test_spawned_workers_get_a_picklable_dataset(source, cache_dir, redis_server):
    kwargs = dict(batch_size=6, train=True, cache_dir=cache_dir, redis=[redis_server.url], seed=4, **SMALL)
    spawned = cached_dataloader(source, workers=1, multiprocessing_context="spawn", **kwargs)
    try:
        assert_same_batches(run_epoch(spawned, 0), run_epoch(cached_dataloader(source, workers=0, **kwargs), 0))
    finally:
        spawned.close()


def test_garbage_is_collected_here_before_workers_fork(source, cache_dir):
    """NOTE [collect before fork]: a cycle dropped before the workers start is finalized in
    this process, not by the first garbage collection inside a forked worker."""
    finalized_in = []

    class Cycle:
        def __init__(self):
            self.me = self  # only the cycle collector frees it

        def __del__(self):
            finalized_in.append(os.getpid())

    garbage = Cycle()
    gc.collect()  # it survives into the oldest generation, which is collected rarely
    del garbage
    loader = cached_dataloader(source, batch_size=4, train=True, workers=2, cache_dir=cache_dir, redis=False,
                               **SMALL)
    try:
        next(iter(loader))
        assert finalized_in == [os.getpid()]
    finally:
        loader.close()
