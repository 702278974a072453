"""Issue 32, item 15: a shard with ``allkeys-lru`` is warned about once, and the warm-up
reports the samples really present, not those it wrote (evicted meanwhile).

A real redis-server with ``maxmemory 3mb`` and ``allkeys-lru``; another client writes to it
while the warm-up runs (as a second size, or training write-backs would), so Redis
evicts samples the warm-up had written.
"""
from __future__ import annotations

import warnings

import pytest

from cachepipe import CacheWarning, TwoLevelCache
from cachepipe.warmup import warmup
from tools.demo_dataset import make_dataset


def test_an_evicting_shard_is_named_and_coverage_is_what_is_there(tmp_path, redis_servers):
    src = make_dataset(tmp_path / "data", classes=4, per_class=10, val_per_class=0, size=64) / "train"
    server = redis_servers(1, maxmemory="3mb", policy="allkeys-lru")[0]
    other = server.client()
    junk = iter(range(1000))

    def another_writer(_done: int) -> None:  # ~400 KB of someone else's keys after each batch
        for _ in range(2):
            other.set(f"other:{next(junk)}", b"x" * 200_000)

    with TwoLevelCache(src, tmp_path / "cache", [server.url], 128) as cache:
        with pytest.warns(CacheWarning, match=f"{server.url} uses maxmemory-policy allkeys-lru"):
            r = warmup(cache, batch_size=4, progress=False, on_progress=another_writer)
        present = len(cache) - len(cache.store.missing(range(len(cache))))
        assert r["l2_written"] > present  # Redis evicted some of what was written
        assert r["l2_cached"] == present and r["l2_cached"] + r["l2_uncached"] == len(cache)
        with warnings.catch_warnings():
            warnings.simplefilter("error", CacheWarning)  # once per shard: not again
            again = warmup(cache, progress=False)
        assert again["l2_cached"] == len(cache) - len(cache.store.missing(range(len(cache))))
