"""Issue 32, item 17: the embedded server restarted under a reader keeps the memory it was
given, and ``server start`` with a bad size is a usage error.

Real embedded redis-server processes, stopped by the real ``cachepipe server stop`` while a
cache reads from them.
"""
from __future__ import annotations

import time
import warnings

from cachepipe import CacheWarning, EmbeddedRedis, TwoLevelCache
from tools.cli import main as cli


def test_a_server_restarted_mid_run_keeps_the_l2_memory_given(source, cache_dir):
    assert cli(["warmup", str(source), "--cache-dir", str(cache_dir), "--cache-size", "32", "--workers", "1",
                "--quiet", "--l2-memory", "64mb"]) == 0
    server = EmbeddedRedis(cache_dir)
    assert server.status()["maxmemory"] == 64 << 20
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        with TwoLevelCache(source, cache_dir, None, 32) as cache:  # training: no --l2-memory of its own
            assert cache.get_many(range(24)) and cache.stats()["l2_hits"] == 24
            assert cli(["server", "stop", "--cache-dir", str(cache_dir)]) == 0
            deadline = time.monotonic() + 10
            while cache.stats()["l2_restarts"] == 0:  # reads fall back to L1, then revive the server
                assert time.monotonic() < deadline, cache.stats()
                cache.get_many(range(24))
                time.sleep(0.05)
    assert server.status()["maxmemory"] == 64 << 20  # not 25 % of RAM


def test_server_start_with_a_bad_size_is_a_usage_error(cache_dir, capsys):
    assert cli(["server", "start", "--cache-dir", str(cache_dir), "--l2-memory", "bogus"]) == 2
    assert "--l2-memory" in capsys.readouterr().err and not EmbeddedRedis(cache_dir).ping()
