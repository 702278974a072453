"""L2 on a real Redis Cluster (three primaries formed by the fixture)."""
from __future__ import annotations

import numpy as np
import pytest

from cachepipe import CacheWarning, TwoLevelCache
from cachepipe.warmup import warmup
from tests.cachepipe.conftest import reference_pixels


def test_cluster_round_trip_and_spread(source, cache_dir, redis_cluster):
    url, clients, procs = redis_cluster
    with TwoLevelCache(source, cache_dir, url, 32) as cache:
        report = warmup(cache, progress=False)
        n = len(cache)
        assert report["l2_written"] == n
        per_node = [c.dbsize() for c in clients]
        assert sum(per_node) == n and min(per_node) > 0  # keys spread over the primaries
        got = cache.get_many(range(n))
        assert cache.stats()["l2_hits"] == n
        for i in (0, n - 1):
            np.testing.assert_array_equal(got[i], reference_pixels(open(cache.manifest.path(i), "rb").read(), 32))
        assert warmup(cache, progress=False)["nothing_to_do"]
        procs[2].kill()  # a primary dies: its slots are gone, reads fall back to L1
        procs[2].wait()
        with pytest.warns(CacheWarning, match="Redis Cluster .* failed on read"):
            after = cache.get_many(range(n))
        st = cache.stats()
        assert st["l2_errors"] >= 1 and st["l1_hits"] > 0 and st["source_reads"] == n
        assert all(np.array_equal(a, b) for a, b in zip(got, after))


def test_cluster_holds_several_sizes_and_the_fixed_subset_record(source, cache_dir, redis_cluster):
    from cachepipe.coverage import coverage

    url, clients, _ = redis_cluster
    for size in (32, 48):
        with TwoLevelCache(source, cache_dir, url, size) as cache:
            assert warmup(cache, progress=False)["l2_written"] == len(cache)
    with TwoLevelCache(source, cache_dir, url, 48) as cache:
        rows = coverage(cache)["l2"]["sizes"]  # one scan of every primary finds both sizes
        assert [(r["size"], r["present"], r["partial"]) for r in rows] == [(32, 24, {}), (48, 24, {})]
        cache.store.mark_partial("1/2", 5)
        assert cache.store.partial() == {"1/2": 5}
        assert [r["partial"] for r in coverage(cache, [48, 64])["l2"]["sizes"]] == [{"1/2": 5}, {}]
        cache.store.mark_partial("1/2", 0)
        assert cache.store.partial() == {}
