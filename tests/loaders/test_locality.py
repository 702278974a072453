"""Node-local sampling over real Redis servers, one per emulated node (NOTE [node-local order]):
every sample once per epoch across ranks, equal steps, determinism, resume, dead shards, bad input."""
from __future__ import annotations

import contextlib
import pickle
from collections import Counter

import numpy as np
import pytest
import torch

from cachepipe import TwoLevelCache
from cachepipe.l2.placement import LocalityError
from cachepipe.warmup import warmup
from loaders import cached_dataloader
from loaders.locality import NodeLocality
from loaders.sampler import ShardedBatchSampler, shard_indices
from tests.distributed import run_distributed


def _warm_cache(source, cache_dir, urls, **kw):
    cache = TwoLevelCache(source, cache_dir, redis=urls, cache_size=24, **kw)
    warmup(cache, progress=False)
    return cache


def _ranks(cache, nodes, local_size=2, *, locality="node", batch_size=2, drop_last=True, **kw):
    world = nodes * local_size
    return [cached_dataloader(cache.manifest.root, cache=cache, batch_size=batch_size, train=True, size=16,
                              workers=0, distributed=(r, world), local_size=local_size, locality=locality,
                              drop_last=drop_last, seed=3, **kw) for r in range(world)]


def _epoch(loaders, epoch):
    out = []
    for loader in loaders:
        loader.set_epoch(epoch)
        out.append([i for batch in loader.sampler for i in batch])
    return out


def _held_by(clients, cache, indices):
    """Node whose Redis really holds each index (asked of the servers, not of the placement code)."""
    return [next(k for k, c in enumerate(clients) if c.exists(f"{cache.namespace}{i}")) for i in indices]


@pytest.mark.parametrize("nodes", [2, 3])
def test_every_sample_once_per_epoch_mostly_from_the_own_node(source, cache_dir, redis_servers, nodes):
    servers = redis_servers(nodes)
    cache = _warm_cache(source, cache_dir, [s.url for s in servers])
    n = len(cache)  # 24: divisible by 4 and 6 ranks, so nothing is padded or dropped
    held = _held_by([s.client() for s in servers], cache, range(n))
    assert set(held) == set(range(nodes))  # the test below needs samples on every node
    for locality in ("node", "global"):
        loaders = _ranks(cache, nodes, locality=locality, exchange_fraction=0.0)
        assert len({len(loader) for loader in loaders}) == 1  # equal step counts per rank
        for epoch in (0, 1):
            per_rank = _epoch(loaders, epoch)
            assert sorted(i for r in per_rank for i in r) == list(range(n))
            assert len({len(r) for r in per_rank}) == 1
            if locality == "node":
                # off-node draws are exactly the balancing moves: what the fuller nodes have over quota
                off = sum(held[i] != rank // 2 for rank, r in enumerate(per_rank) for i in r)
                assert off == sum(max(0, c - n // nodes) for c in Counter(held).values())
        if locality == "node":
            assert loaders[0].sampler.locality.labels.tolist() == cache.manifest.targets  # balanced per class
            labels = torch.cat([y for _, y in loaders[1]]).tolist()
            assert labels == [cache.manifest.targets[i] for i in per_rank[1]]
            assert loaders[1].cache_hits["l2_hits"] == len(labels)


def test_uneven_partitions_pad_or_drop_like_distributed_sampler():
    home = np.array([0] * 20 + [1] * 5 + [2] * 4)  # 29 samples over 3 nodes x 2 ranks, very uneven
    loc = NodeLocality(home, local_size=2, exchange_fraction=0.0)
    padded = [loc.indices(epoch=0, seed=1, rank=r, world_size=6, drop_last=False) for r in range(6)]
    counts = Counter(i for r in padded for i in r)
    assert [len(r) for r in padded] == [5] * 6  # ceil(29 / 6)
    assert set(counts) == set(range(29)) and sum(counts.values()) == 30  # one repeat, as DistributedSampler
    cut = [loc.indices(epoch=0, seed=1, rank=r, world_size=6, drop_last=True) for r in range(6)]
    flat = [i for r in cut for i in r]
    assert [len(r) for r in cut] == [4] * 6 and len(set(flat)) == 24  # floor(29 / 6), 5 left out
    # the short nodes keep all their own samples and fill up with node 0's surplus (node 2
    # still lacks one sample and repeats one); node 0 keeps as many of its own as its quota
    for parts, quota in ((padded, 10), (cut, 8)):
        drawn = [{i for r in (2 * m, 2 * m + 1) for i in parts[r]} for m in range(3)]
        assert sum(home[i] == 0 for i in drawn[0]) == quota
        assert all({i for i in range(29) if home[i] == m} <= drawn[m] for m in (1, 2))


def test_exchange_moves_a_fresh_fraction_each_epoch():
    home = np.repeat([0, 1], 500)
    loc = NodeLocality(home, local_size=2, exchange_fraction=0.2)
    moved = []
    for epoch in (0, 1):
        parts = [loc.indices(epoch=epoch, seed=0, rank=r, world_size=4, drop_last=True) for r in range(4)]
        assert sorted(i for p in parts for i in p) == list(range(1000))
        moved.append({i for r, p in enumerate(parts) for i in p if home[i] != r // 2})
    for m in moved:  # 200 dealt round-robin over 2 nodes: ~half of them leave home (+- balancing)
        assert 60 <= len(m) <= 140
    assert moved[0] != moved[1]


def _node_class_counts(loc, labels, epoch=0):
    parts = [loc.indices(epoch=epoch, seed=0, rank=r, world_size=4, drop_last=True) for r in range(4)]
    assert sorted(i for p in parts for i in p) == list(range(len(labels)))  # still every sample once
    return np.stack([np.bincount(labels[parts[2 * m] + parts[2 * m + 1]], minlength=2) for m in (0, 1)])


def test_balancing_moves_and_the_exchange_even_out_the_classes_between_nodes():
    # node 0 holds 260 samples, 180 of class 0; node 1 holds 140, 120 of class 1
    labels = np.array([0] * 180 + [1] * 80 + [0] * 20 + [1] * 120)
    home = np.repeat([0, 1], [260, 140])
    # the 60 samples node 0 has over its quota of 200 are all of the class it has too many of
    balanced = _node_class_counts(NodeLocality(home, 2, 0.0, labels), labels)
    assert balanced.tolist() == [[120, 80], [80, 120]]
    blind = _node_class_counts(NodeLocality(home, 2, 0.0), labels)  # without labels: random ones
    assert blind[0, 0] > 120
    # with an exchange the same samples cross as without labels, only other ones of them
    # (the classes a node has too many of): the bytes across nodes do not change
    for epoch in (0, 1):
        with_labels, without = (NodeLocality(home, 2, 0.1, lab) for lab in (labels, None))
        off = [sum(home[i] != r // 2 for r in range(4)
                   for i in loc.indices(epoch=epoch, seed=0, rank=r, world_size=4, drop_last=True))
               for loc in (with_labels, without)]
        assert off[0] == off[1] > 60
        (a0, a1), (b0, b1) = (_node_class_counts(loc, labels, epoch) for loc in (with_labels, without))
        assert np.abs(a0 - a1).max() < np.abs(b0 - b1).max()


def test_one_node_or_global_is_todays_order():
    home = np.array([0, 1] * 10)
    for world, local_size in ((4, 4), (2, 2)):
        s = ShardedBatchSampler(20, 2, shuffle=True, seed=4, rank=1, world_size=world,
                                locality=None if local_size == world else NodeLocality(home, local_size))
        s.set_epoch(2)
        assert s.indices() == shard_indices(20, epoch=2, seed=4, rank=1, world_size=world, shuffle=True,
                                            drop_last=False)


def test_deterministic_and_resume_is_exact(source, cache_dir, redis_servers):
    urls = [s.url for s in redis_servers(2)]
    cache = _warm_cache(source, cache_dir, urls)
    a, b = _ranks(cache, 2), _ranks(cache, 2)  # built separately, e.g. in two processes
    assert _epoch(a, 4) == _epoch(b, 4) and _epoch(a, 4) != _epoch(a, 5)
    loader = a[3]
    loader.set_epoch(4)
    it = iter(loader)
    seen = [next(it)[1] for _ in range(2)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    rest = [y for _, y in it]
    resumed = b[3]
    resumed.load_state_dict(state)
    resumed.set_epoch(4)
    assert [y.tolist() for _, y in resumed] == [y.tolist() for y in rest] and len(seen + rest) == len(loader)
    glob = _ranks(cache, 2, locality="global")[3]
    with pytest.raises(ValueError, match="locality='node'"):
        glob.load_state_dict(state)
    other = _ranks(cache, 2, exchange_fraction=0.5)[3]
    with pytest.raises(ValueError, match="exchange_fraction"):
        other.load_state_dict(state)


def test_a_dead_shards_samples_are_drawn_once_and_served_from_l1(source, cache_dir, redis_servers):
    servers = redis_servers(2)
    cache = _warm_cache(source, cache_dir, [s.url for s in servers])
    held = _held_by([s.client() for s in servers], cache, range(len(cache)))
    servers[1].kill()
    assert cache.store.node_of(range(len(cache))).tolist() == [0 if h == 0 else -1 for h in held]
    loaders = _ranks(cache, 2, exchange_fraction=0.0)
    per_rank = _epoch(loaders, 0)
    assert sorted(i for r in per_rank for i in r) == list(range(len(cache)))
    node1 = loaders[2]
    with pytest.warns(Warning, match="failed on read"):
        labels = torch.cat([y for _, y in node1]).tolist()
    assert labels == [cache.manifest.targets[i] for i in per_rank[2]]
    assert node1.cache_hits["l1_hits"] > 0


@pytest.mark.parametrize("kwargs,match", [
    (dict(exchange_fraction=-0.1), r"exchange_fraction must be in \[0, 1\]"),
    (dict(exchange_fraction=1.5), r"exchange_fraction must be in \[0, 1\]"),
    (dict(locality="rack"), "unknown locality 'rack'; valid"),
    (dict(local_size=3), "local_size must divide"),
])
def test_bad_arguments(source, cache_dir, kwargs, match):
    args = {**dict(batch_size=2, train=True, cache_dir=cache_dir, redis=False, distributed=(0, 4), locality="node",
                   local_size=2), **kwargs}
    with pytest.raises(ValueError, match=match):
        cached_dataloader(source, **args)


def test_unsupported_stores_are_refused_saying_why(source, cache_dir, redis_servers):
    common = dict(batch_size=2, train=True, cache_dir=cache_dir, distributed=(0, 4), local_size=2, locality="node")
    with pytest.raises(LocalityError, match="no L2"):
        cached_dataloader(source, redis=False, **common)
    with pytest.raises(LocalityError, match="embedded Redis"):
        cached_dataloader(source, redis=None, **common)
    urls = [s.url for s in redis_servers(3)]
    with pytest.raises(LocalityError, match="2 nodes need one Redis URL per node.* but 3 URL"):
        cached_dataloader(source, redis=urls, **common)
    # one node: nothing to place, today's order (the embedded server is fine); validation is placed too
    assert cached_dataloader(source, redis=False, **dict(common, local_size=4)).sampler.locality is None
    with pytest.raises(LocalityError, match="no L2"):
        cached_dataloader(source, redis=False, **dict(common, train=False))


def _rank_placement(rank, world, root, cache_dir, urls):
    loader = cached_dataloader(root, batch_size=2, train=True, size=16, workers=0, cache_dir=cache_dir,
                               redis=urls, cache_size=24, local_size=1, locality="node")
    loader.set_epoch(0)
    return loader.sampler.locality.home.tolist(), loader.sampler.indices()


def test_real_ranks_agree_on_rank_zeros_placement(source, tmp_path, redis_servers):
    urls = [s.url for s in redis_servers(2)]
    _warm_cache(source, tmp_path / "cache", urls).close()
    results = run_distributed(_rank_placement, 2, str(source), str(tmp_path / "cache"), urls)
    assert results[0][0] == results[1][0]
    assert sorted(results[0][1] + results[1][1]) == list(range(24))


@pytest.mark.dali
def test_dali_loader_draws_the_same_node_local_order(source, cache_dir, redis_servers):
    from loaders import build_dali_loader

    cache = _warm_cache(source, cache_dir, [s.url for s in redis_servers(2)])
    torch_side = _ranks(cache, 2, local_size=1, batch_size=4)
    dali = build_dali_loader(cache.manifest.root, cache=cache, batch_size=4, train=True, size=16, device="cpu",
                             workers=0, shard_id=1, num_shards=2, local_size=1, locality="node", seed=3)
    try:
        dali.set_epoch(2)
        torch_side[1].set_epoch(2)
        assert dali.sampler.indices() == torch_side[1].sampler.indices()
        labels = torch.cat([y for _, y in dali]).tolist()
        assert labels == [cache.manifest.targets[i] for i in dali.sampler.indices()]
    finally:
        dali.close()


def test_validation_indices_are_each_sample_once_on_its_own_node():
    """NOTE [validation on its node]: a node validates what it holds; samples no shard holds
    are dealt round-robin to the nodes."""
    home = np.array([0, 1, 1, -1, 0, 0, 1, -1, -1, 0, 1])
    loc = NodeLocality(home, local_size=2)
    shares = [loc.validation_indices(rank=r, world_size=4) for r in range(4)]
    assert sorted(i for s in shares for i in s) == list(range(len(home)))
    lost = [3, 7, 8]  # dealt to nodes 0, 1, 0
    for rank, share in enumerate(shares):
        node = rank // 2
        assert all(home[i] == node or (i in lost and lost.index(i) % 2 == node) for i in share)
        assert share == sorted(share)  # dataset order
    s = ShardedBatchSampler(len(home), 2, shuffle=False, rank=1, world_size=4, locality=loc)
    assert [i for b in s for i in b] == shares[1] and len(s) == len(list(s))


def _validation_reads(cache, locality):
    loaders = [cached_dataloader(cache.manifest.root, cache=cache, batch_size=4, train=False, size=16, workers=0,
                                 distributed=(r, 4), local_size=2, locality=locality) for r in range(4)]
    return [[i for b in loader.sampler for i in b] for loader in loaders], loaders


def test_node_validation_reads_only_its_own_nodes_server(source, cache_dir, redis_servers):
    servers = redis_servers(2)
    cache = _warm_cache(source, cache_dir, [s.url for s in servers])
    held = _held_by([s.client() for s in servers], cache, range(len(cache)))
    shares, loaders = _validation_reads(cache, "node")
    assert sorted(i for s in shares for i in s) == list(range(len(cache)))
    for rank, (share, loader) in enumerate(zip(shares, loaders)):
        assert {held[i] for i in share} <= {rank // 2}
        labels = torch.cat([y for _, y in loader]).tolist()
        assert labels == [cache.manifest.targets[i] for i in share]
        assert loader.cache_hits["l2_hits"] == len(share) and loader.cache_hits["l1_hits"] == 0
    glob, _ = _validation_reads(cache, "global")
    # what node-local avoids: global validation reads across nodes (about half its samples; how
    # many depends on where the rendezvous hash of the servers' random ports puts them)
    assert sum(held[i] != r // 2 for r, s in enumerate(glob) for i in s) > 0


def _evaluate_both(rank, world, root, cache_dir, urls):
    from trainer.evaluate import evaluate
    from trainer.models import create

    torch.manual_seed(0)
    model = create("resnet_small", num_classes=4)
    out = {}
    for locality in ("global", "node"):
        loader = cached_dataloader(root, batch_size=4, train=False, size=16, workers=0, cache_dir=cache_dir,
                                   redis=urls, cache_size=24, distributed=(rank, world), local_size=1,
                                   locality=locality)
        out[locality] = evaluate(model, loader, torch.device("cpu"), contextlib.nullcontext)
        loader.close()
    return out


def test_node_validation_gives_global_validations_result_on_real_ranks(source, tmp_path, redis_servers):
    urls = [s.url for s in redis_servers(2)]
    _warm_cache(source, tmp_path / "cache", urls).close()
    results = run_distributed(_evaluate_both, 2, str(source), str(tmp_path / "cache"), urls)  # 2 nodes x 1
    exact = ("val_top1", "val_top5", "val_images")  # counts: equal; the loss sums in another order
    for r in results:
        assert {k: r["node"][k] for k in exact} == {k: results[0]["global"][k] for k in exact}
        assert r["node"]["val_loss"] == pytest.approx(results[0]["global"]["val_loss"], rel=1e-5)
    assert results[0]["node"]["val_images"] == 24 and 0 < results[0]["node"]["val_top1"] < 100
