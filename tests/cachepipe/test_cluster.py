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
