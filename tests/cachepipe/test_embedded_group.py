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


def test_a_start_without_memory_keeps_the_running_servers_maxmemory(source, cache_dir):
    """Issue 46, defect 8: ``--l2-servers 2`` without ``--l2-memory`` set each running server's
    maxmemory to a share of 25 % of RAM (CONFIG SET), against "keep a running server's value"."""
    try:
        assert EmbeddedGroup(cache_dir, 2).start("64mb")
        maxmemory = lambda: [s.client().config_get("maxmemory")["maxmemory"]  # noqa: E731
                             for s in EmbeddedGroup(cache_dir, 2).servers]
        assert maxmemory() == [str(32 << 20)] * 2
        assert not EmbeddedGroup(cache_dir, 2).start()  # server start --l2-servers 2
        with TwoLevelCache(CacheConfig(source, cache_dir, L2Spec.embedded(servers=2), SIZE)) as cache:
            cache.get_many(range(24))  # training, and each loader worker, take the same path
        assert maxmemory() == [str(32 << 20)] * 2
        EmbeddedGroup(cache_dir, 2).servers[1].stop()
        assert EmbeddedGroup(cache_dir, 2).start()  # a restarted one keeps its last size too
        assert maxmemory() == [str(32 << 20)] * 2
    finally:
        assert EmbeddedGroup.found(cache_dir).stop()


def test_a_new_group_without_memory_shares_the_default_and_the_count_is_bounded(cache_dir, monkeypatch):
    import cachepipe.server.embedded as embedded

    monkeypatch.setattr(embedded, "_physical_memory", lambda: 4 << 30)  # 25 %: 1 GiB for the node
    try:
        assert EmbeddedGroup(cache_dir, 2).start()
        assert [s.status()["maxmemory"] for s in EmbeddedGroup(cache_dir, 2).servers] == [512 << 20] * 2
    finally:
        EmbeddedGroup.found(cache_dir).stop()
    from cachepipe.server.embedded_group import max_l2_servers

    assert max_l2_servers(2) == 8 and max_l2_servers(64) == 64
    with pytest.raises(ValueError, match=r"l2_servers \(--l2-servers\) 100: at most"):
        L2Spec.embedded(servers=100)


@pytest.mark.parametrize("command", ["server start", "warmup SRC"])
def test_too_many_servers_is_one_line_naming_the_flag_and_starts_nothing(source, cache_dir, command):
    from tests.forked import run_tools

    argv = [str(source) if a == "SRC" else a for a in command.split()]
    res = run_tools(*argv, "--cache-dir", cache_dir, "--l2-servers", "100")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "--l2-servers" in res.stderr, res.stderr
    assert "100: at most" in res.stderr and not cache_dir.exists()
