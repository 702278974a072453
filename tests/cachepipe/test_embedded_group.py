"""Several embedded redis-servers per node: reads spread over them, each revived when it dies."""
from __future__ import annotations

import numpy as np
import pytest

from cachepipe import CacheConfig, CacheWarning, TwoLevelCache
from cachepipe.l2.spec import L2Spec
from cachepipe.server.embedded_group import EmbeddedGroup, default_l2_servers

SIZE = 40


def test_default_servers_follow_the_cores():
    assert [default_l2_servers(c) for c in (1, 2, 8, 16, 64, 256)] == [1, 1, 1, 2, 8, 8]
    with pytest.raises(ValueError, match="--l2-servers"):
        CacheConfig("/tmp/src", "/tmp/cache", L2Spec.embedded(servers=0))


def test_samples_spread_over_the_servers_and_a_dead_one_is_revived(source, cache_dir):
    config = CacheConfig(source, cache_dir, L2Spec.embedded(servers=2, memory="64mb"), SIZE)
    try:
        with TwoLevelCache(config) as cache:
            expected = cache.get_many(range(24))  # fills L2
            servers = cache.embedded_group().servers
            keys = [s.client().dbsize() for s in servers]
            assert sum(keys) == 24 and min(keys) > 0  # both servers hold a share
            assert all(s.client().config_get("maxmemory")["maxmemory"] == str(32 << 20) for s in servers)
            assert cache.get_many(range(24)) and cache.stats()["l2_hits"] == 24
            servers[1].stop()
            with pytest.warns(CacheWarning, match="failed on read"):
                got = cache.get_many(range(24))  # server 1's share from L1 meanwhile
            cache._store.health[1].retry_at = 0  # the backoff window is over
            again = cache.get_many(range(24))
            assert servers[1].ping() and cache.stats()["l2_restarts"] == 1
            for a, b, c in zip(expected, got, again):
                np.testing.assert_array_equal(a, b)
                np.testing.assert_array_equal(a, c)
    finally:
        assert EmbeddedGroup.found(cache_dir).stop()  # both directories found, both stopped
