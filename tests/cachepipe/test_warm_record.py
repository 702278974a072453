"""NOTE [completion record]: a finished warm-up is known without N round trips, and only while it holds."""
from __future__ import annotations

import json

from cachepipe import TwoLevelCache
from cachepipe.l2.shards import ShardedRedisStore
from cachepipe.warm_record import SAMPLE
from cachepipe.warmup import warmup


def _asked(monkeypatch) -> list[int]:
    """How many keys each ``missing`` call asked the real store about."""
    asked = []
    real = ShardedRedisStore.missing
    monkeypatch.setattr(ShardedRedisStore, "missing", lambda self, idx: asked.append(len(idx)) or real(self, idx))
    return asked


def test_second_warmup_trusts_the_record_after_a_sample(source, cache_dir, redis_servers, monkeypatch):
    servers = redis_servers(2)
    with TwoLevelCache(source, cache_dir, [s.url for s in servers], 32) as cache:
        n = len(cache)
        first = warmup(cache, progress=False)
        record = json.loads((cache.l1_path.parent / "warm.json").read_text())
        assert first["l2_written"] == n and record[cache.namespace]["0/1"]["partition"] == n
        asked = _asked(monkeypatch)
        again = warmup(cache, progress=False)
        assert again["nothing_to_do"] and again["l2_cached"] == n and asked == [min(SAMPLE, n)]
        servers[1].client().flushall()  # a server that lost its keys: the sample sees it
        asked.clear()
        third = warmup(cache, progress=False)
        assert not third["nothing_to_do"] and 0 < third["l2_written"] < n and asked == [n, n]
        assert cache.store.missing(list(range(n))) == []


def test_no_record_for_a_fixed_subset_nor_for_other_shards(source, cache_dir, redis_servers, monkeypatch):
    small, big = redis_servers(1, maxmemory="3mb")[0], redis_servers(1)[0]
    with TwoLevelCache(source, cache_dir, [small.url], 256) as cache:
        r = warmup(cache, progress=False)
        assert r["l2_uncached"] > 0 and not (cache.l1_path.parent / "warm.json").exists()
    with TwoLevelCache(source, cache_dir, [big.url], 32) as cache:
        warmup(cache, progress=False)
        assert (cache.l1_path.parent / "warm.json").exists()
    with TwoLevelCache(source, cache_dir, [small.url], 32) as cache:  # same namespace, other shards
        asked = _asked(monkeypatch)
        r = warmup(cache, progress=False)
        assert asked[0] == len(cache) and not r["nothing_to_do"]  # every key asked for, then written
