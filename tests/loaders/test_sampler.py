"""Rank sharding, epoch reshuffling, batching and resume of ShardedBatchSampler (no processes needed:
every rank's share is a pure function of (seed, epoch, rank, world_size); tests/loaders/test_distributed.py
checks the same with a real gloo group)."""
from __future__ import annotations

import pickle
from collections import Counter

import pytest
from torch.utils.data import DistributedSampler

from loaders.sampler import BatchRequest, ShardedBatchSampler, shard_indices


def epoch_batches(n, batch, world, epoch, *, shuffle=True, drop_last=False, seed=0):
    out = []
    for rank in range(world):
        s = ShardedBatchSampler(n, batch, shuffle=shuffle, seed=seed, rank=rank, world_size=world,
                                drop_last=drop_last)
        s.set_epoch(epoch)
        out.append([list(b) for b in s])
    return out


@pytest.mark.parametrize("n,world,drop_last", [(20, 2, False), (20, 4, True), (23, 4, False), (23, 4, True),
                                               (3, 4, False)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_shards_equal_torch_distributed_sampler(n, world, drop_last, shuffle):
    for epoch in (0, 3):
        for rank in range(world):
            ref = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=5,
                                     drop_last=drop_last)
            ref.set_epoch(epoch)
            assert shard_indices(n, epoch=epoch, seed=5, rank=rank, world_size=world, shuffle=shuffle,
                                 drop_last=drop_last) == list(ref)


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_are_disjoint_and_complete_and_reshuffle_per_epoch(world):
    n, batch = 48, 5  # 48 divides by 2 and 4: no padding, no truncation
    orders = []
    for epoch in range(3):
        ranks = epoch_batches(n, batch, world, epoch)
        assert len({len(r) for r in ranks}) == 1  # every rank stops on the same iteration
        flat = [[i for b in r for i in b] for r in ranks]
        union = [i for f in flat for i in f]
        assert sorted(union) == list(range(n))  # complete, and disjoint (no duplicates)
        orders.append(flat)
    assert orders[0] != orders[1] != orders[2]
    assert epoch_batches(n, batch, world, 1) == epoch_batches(n, batch, world, 1)  # same on every call/rank


def test_uneven_sizes_pad_or_truncate_but_all_ranks_match():
    n, world = 23, 4
    padded = epoch_batches(n, 4, world, 0, drop_last=False)
    counts = Counter(i for r in padded for b in r for i in b)
    assert set(counts) == set(range(n)) and sum(counts.values()) == 24  # one wrap-around repeat
    assert [len(b) for b in padded[0]] == [4, 2] and all(len(r) == 2 for r in padded)
    cut = epoch_batches(n, 4, world, 0, drop_last=True)
    flat = [i for r in cut for b in r for i in b]
    # cut to 20 (5 per rank), then each rank drops its partial batch: one batch of 4 per rank
    assert len(flat) == len(set(flat)) == 16 and all(len(b) == 4 for r in cut for b in r)


def test_validation_order_is_the_dataset_order():
    assert epoch_batches(10, 4, 1, 3, shuffle=False) == [[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]]


def test_len_matches_iteration():
    for n, batch, world, drop in [(23, 4, 4, False), (23, 4, 2, True), (100, 7, 3, False), (100, 7, 3, True)]:
        s = ShardedBatchSampler(n, batch, shuffle=True, rank=world - 1, world_size=world, drop_last=drop)
        assert len(s) == len(list(s))


def test_resume_yields_exactly_the_remaining_batches():
    a = ShardedBatchSampler(50, 4, shuffle=True, seed=3, rank=1, world_size=2)
    a.set_epoch(2)
    a.set_size(96)
    it = iter(a)
    first = [list(next(it)) for _ in range(3)]
    state = a.state_dict(batches_done=3)
    b = ShardedBatchSampler(50, 4, shuffle=True, seed=3, rank=1, world_size=2)
    b.load_state_dict(pickle.loads(pickle.dumps(state)))
    b.set_epoch(2)  # the usual loop calls set_epoch(epoch) again: the position is kept
    rest = list(b)
    assert [r.number for r in rest] == list(range(3, len(a)))
    assert all(r.size == 96 and r.epoch == 2 for r in rest)
    assert first + [list(r) for r in rest] == [list(r) for r in a]
    assert [list(r) for r in b] == [list(r) for r in a]  # the pass after the resumed one is a full epoch


def test_resume_refuses_a_different_setup():
    state = ShardedBatchSampler(50, 4, shuffle=True, world_size=2).state_dict(1)
    with pytest.raises(ValueError, match="world_size"):
        ShardedBatchSampler(50, 4, shuffle=True, world_size=4).load_state_dict(state)
    with pytest.raises(ValueError, match="num_samples"):
        ShardedBatchSampler(51, 4, shuffle=True, world_size=2).load_state_dict(state)


def test_requests_carry_size_epoch_and_a_per_batch_seed_through_pickling():
    s = ShardedBatchSampler(10, 4, shuffle=True, seed=1)
    s.set_epoch(5)
    r0 = next(iter(s))
    s.set_size(128)
    r1 = list(s)[1]
    assert (r0.epoch, r0.number, r0.size) == (5, 0, 224) and (r1.size, r1.number) == (128, 1)
    back = pickle.loads(pickle.dumps(r1))
    assert isinstance(back, BatchRequest) and list(back) == list(r1)
    assert (back.epoch, back.number, back.size, back.seed) == (r1.epoch, r1.number, r1.size, r1.seed)
    assert r0.seed != r1.seed


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_samples=0, batch_size=1), "num_samples"),
    (dict(num_samples=5, batch_size=1, rank=2, world_size=2), "rank"),
    (dict(num_samples=5, batch_size=4, world_size=2, drop_last=True), "no full batch"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ShardedBatchSampler(shuffle=True, **kwargs)
