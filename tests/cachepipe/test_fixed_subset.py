"""Sources larger than L2 (NOTE [fixed L2 subset]) and several cached sizes in one Redis,
with real redis-server processes: what fits stays in L2, the rest is read from L1 with
the right pixels and no warnings; every size reads its own namespace."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from cachepipe import CacheWarning, TwoLevelCache, decode_and_resize
from cachepipe.warmup import L2TooSmallError, warmup
from loaders import cached_dataloader


def source_pixels(cache, index: int) -> np.ndarray:
    """The oracle: the source file decoded and resized the one documented way."""
    with open(cache.manifest.path(index), "rb") as f:
        return decode_and_resize(f.read(), cache.config.cache_size)


def partial_warmup(source, cache_dir, server) -> dict:
    """Warm 256 px samples into a 3 MB server: a few of the 24 fit (~250 KB each)."""
    with TwoLevelCache(source, cache_dir, [server.url], 256) as cache:
        with pytest.raises(L2TooSmallError, match="is too small"):
            warmup(cache, progress=False, require_full=True)
        assert server.client().dbsize() == 0  # refused before writing
        report = warmup(cache, progress=False)
    return report


def test_partition_larger_than_l2_is_a_fixed_subset_read_from_l1_without_warnings(source, cache_dir,
                                                                                   redis_servers):
    server = redis_servers(1, maxmemory="3mb")[0]
    r = partial_warmup(source, cache_dir, server)
    cached = r["l2_cached"]
    assert 0 < cached < 24 and r["l2_cached"] + r["l2_uncached"] == 24 and r["l2_write_errors"] == 0
    assert r["l2_coverage"] == pytest.approx(cached / 24) and r["l1_written"] == 24
    keys = server.client().dbsize()
    assert keys == cached + 1  # the samples and the <namespace>partial record
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning per sample, nor per process
        with TwoLevelCache(source, cache_dir, [server.url], 256) as cache:
            assert cache.store.partial() == {"0/1": 24 - cached}
            for _ in range(2):  # the second pass finds the same subset: misses were not written
                got = cache.get_many(range(24))
            for i in range(24):
                np.testing.assert_array_equal(got[i], source_pixels(cache, i))
            stats = cache.stats()
    assert (stats["l2_hits"], stats["l1_hits"], stats["source_reads"]) == (2 * cached, 2 * (24 - cached), 0)
    assert stats["l2_writes"] == stats["l2_oom"] == stats["l2_write_errors"] == 0
    assert server.client().dbsize() == keys


def test_loader_over_a_partial_l2_matches_decoding_the_source(source, cache_dir, redis_servers):
    server = redis_servers(1, maxmemory="3mb")[0]
    cached = partial_warmup(source, cache_dir, server)["l2_cached"]
    kwargs = dict(batch_size=5, train=False, size=224, cache_size=256, dtype="uint8", normalize=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = cached_dataloader(source, workers=0, cache_dir=cache_dir, redis=[server.url], **kwargs)
        plain = cached_dataloader(source, workers=0, cache=False, **kwargs)
        try:
            for (x, y), (px, py) in zip(loader, plain, strict=True):
                assert torch.equal(y, py) and torch.equal(x, px)
            assert loader.cache_hits == {"l2_hits": cached, "l1_hits": 24 - cached, "source_reads": 0}
        finally:
            loader.close()
            plain.close()


def test_more_memory_and_another_warmup_cover_the_partition_and_clear_the_record(source, cache_dir,
                                                                                  redis_servers):
    server = redis_servers(1, maxmemory="3mb")[0]
    partial_warmup(source, cache_dir, server)
    server.client().config_set("maxmemory", "64mb")
    with TwoLevelCache(source, cache_dir, [server.url], 256) as cache:
        r = warmup(cache, progress=False)
        assert (r["l2_uncached"], r["l2_cached"], r["l2_coverage"]) == (0, 24, 1.0)
        assert cache.store.partial() == {}
    server.client().delete(cache.namespace + "3")
    with TwoLevelCache(source, cache_dir, [server.url], 256) as cache:  # write-back is on again
        cache.get(3)
        assert cache.stats()["l2_writes"] == 1 and cache.store.missing([3]) == []


def test_each_node_records_its_own_part(source, cache_dir, redis_servers):
    servers = redis_servers(2, maxmemory="3mb")
    urls = [s.url for s in servers]
    with TwoLevelCache(source, cache_dir, urls, 32) as small:  # fits: node 1 records nothing
        assert warmup(small, node_rank=1, num_nodes=2, progress=False)["l2_uncached"] == 0
    with TwoLevelCache(source, cache_dir, urls, 320) as big:
        r0 = warmup(big, node_rank=0, num_nodes=2, progress=False)
        assert r0["l2_uncached"] > 0 and r0["l2_cached"] + r0["l2_uncached"] == r0["partition"] > 0
        assert big.store.partial() == {"0/2": r0["l2_uncached"]}
        for s in servers:  # on every shard, so readers find it while one is down
            assert s.client().hget(big.namespace + "partial", "0/2") == str(r0["l2_uncached"]).encode()
    with TwoLevelCache(source, cache_dir, urls, 32) as small:
        assert small.store.partial() == {}  # another size, another namespace


def test_several_sizes_coexist_and_each_reads_its_own(source, cache_dir, redis_server):
    sizes = (32, 48, 64)
    for size in sizes:
        with TwoLevelCache(source, cache_dir, [redis_server.url], size) as cache:
            r = warmup(cache, progress=False)
            assert r["l2_written"] == 24 and r["cache_size"] == size
            assert r["l1_written"] == (24 if size == sizes[0] else 0)  # L1 is shared by the sizes
    assert redis_server.client().dbsize() == 24 * len(sizes)
    for size in sizes:
        with TwoLevelCache(source, cache_dir, [redis_server.url], size) as cache:
            got = cache.get_many(range(24))
            assert cache.stats()["l2_hits"] == 24 and cache.stats()["l1_hits"] == 0
            for i in (0, 7, 23):
                assert min(got[i].shape[:2]) == size
                np.testing.assert_array_equal(got[i], source_pixels(cache, i))
