"""Issue 32, item 11: a cache dir whose name holds ``#``, ``?``, ``%41``, a tab or a newline
works with the embedded server, and a warm-up that cannot use the server it started stops it.

Real redis-server processes started by the code under test; "stopped" means the process
recorded in the cache dir's ``server.id`` is gone.
"""
from __future__ import annotations

import os

import pytest

from cachepipe import EmbeddedRedis, TwoLevelCache
from cachepipe.server.redis_binary import find_redis_server
from tools.cli import main as cli


@pytest.fixture(params=["c#1?x=%41", "tab\tand\nnewline"])
def odd_cache_dir(tmp_path, request):
    path = tmp_path / request.param
    yield path
    EmbeddedRedis(path).stop()


def test_the_embedded_server_works_in_a_cache_dir_with_url_characters(source, odd_cache_dir):
    assert cli(["warmup", str(source), "--cache-dir", str(odd_cache_dir), "--cache-size", "32", "--workers", "1",
                "--quiet", "--l2-memory", "64mb"]) == 0
    with TwoLevelCache(source, odd_cache_dir, None, 32) as cache:
        cache.get_many(range(24))
        assert cache.stats()["l2_hits"] == 24 and cache.stats()["l2_errors"] == 0
    assert cli(["server", "stop", "--cache-dir", str(odd_cache_dir)]) == 0


def test_a_warmup_that_cannot_use_the_server_it_started_stops_it(source, cache_dir, tmp_path, monkeypatch, capsys):
    # a real redis-server configured so that the warm-up cannot use it: INFO is disabled
    wrapper = tmp_path / "redis-server-without-info"
    wrapper.write_text(f'#!/bin/sh\nexec {find_redis_server()} "$@" --rename-command INFO ""\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CACHEPIPE_REDIS_SERVER", str(wrapper))
    assert cli(["warmup", str(source), "--cache-dir", str(cache_dir), "--cache-size", "32", "--workers", "1",
                "--quiet", "--l2-memory", "64mb"]) == 4
    assert "cannot reach L2 shard" in capsys.readouterr().err
    server = EmbeddedRedis(cache_dir)
    assert server.identity() is None and not server.ping()
    assert _servers_on(server.socket_path) == []  # no redis-server of that cache dir is left


def _servers_on(socket) -> list[int]:
    """Pids of processes whose command line names ``socket`` (the servers started for it)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.fsencode(socket) in open(f"/proc/{entry}/cmdline", "rb").read():
                found.append(int(entry))
        except OSError:
            continue
    return found
