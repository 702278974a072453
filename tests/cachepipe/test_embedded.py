"""Embedded Redis: start, reuse, outliving its starter, stale pid/socket recovery."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from cachepipe.server.embedded import EmbeddedRedis, parse_memory

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_start_reuse_stop(cache_dir):
    server = EmbeddedRedis(cache_dir)
    assert not server.ping() and server.status()["running"] is False
    assert server.start("16mb") is True
    pid = server.pid()
    assert pid and server.ping() and server.socket_path.exists()
    assert server.start() is False and server.pid() == pid  # reused, not restarted
    assert server.start("32mb") is False and server.status()["maxmemory"] == 32 * 2**20
    server.client().set("k", b"v")
    assert server.client().config_get("save")["save"] == "" and server.client().config_get("appendonly")["appendonly"] == "no"
    assert server.stop() is True
    assert not server.ping() and not server.pid_path.exists() and server.stop() is False


def _minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def test_large_replies_reuse_server_memory(cache_dir):
    # NOTE [server malloc tuning]: untuned, these MGETs page-fault ~750 times each
    server = EmbeddedRedis(cache_dir)
    server.start()
    try:
        client = server.client()
        keys = [f"k{i}" for i in range(16)]
        client.mset({k: os.urandom(200_000) for k in keys})
        for _ in range(5):
            client.mget(keys)
        before = _minor_faults(server.pid())
        for _ in range(20):
            client.mget(keys)
        assert _minor_faults(server.pid()) - before < 200
    finally:
        server.stop()


def test_outlives_the_process_that_started_it(cache_dir):
    code = f"from cachepipe.server.embedded import EmbeddedRedis; EmbeddedRedis({str(cache_dir)!r}).start('16mb')"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
    server = EmbeddedRedis(cache_dir)
    assert server.ping() and server.pid() is not None


def test_stale_pid_file_and_socket_are_cleaned_up(cache_dir):
    server = EmbeddedRedis(cache_dir)
    server.start("16mb")
    pid = server.pid()
    os.kill(pid, signal.SIGKILL)  # crash: pid file and socket stay behind
    deadline = time.monotonic() + 5
    while server.pid() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.pid_path.exists() and server.socket_path.exists() and not server.ping()
    assert server.start("16mb") is True and server.pid() != pid and server.ping()
    server.stop()
    # a pid file naming a live process that is not redis-server, and a dead socket file
    server.pid_path.parent.mkdir(parents=True, exist_ok=True)
    server.pid_path.write_text(str(os.getpid()))
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(server.socket_path))  # leaves a socket file nobody listens on
    assert server.pid() is None and not server.ping()
    assert server.start("16mb") is True and server.ping()
    assert int(server.pid_path.read_text()) != os.getpid()


def test_long_cache_dir_gets_a_short_socket(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "cache"
    server = EmbeddedRedis(deep)
    assert len(str(server.socket_path)) <= 100 and server.socket_path.parent.name == f"cachepipe-{os.geteuid()}"
    try:
        assert server.start("16mb") and server.ping()
        assert os.stat(server.socket_path.parent).st_mode & 0o777 == 0o700  # NOTE [private socket]
    finally:
        server.stop()


def test_parse_memory():
    assert parse_memory("4gb") == 4 * 2**30 and parse_memory("512MiB") == 512 * 2**20
    assert parse_memory("2m") == 2_000_000 and parse_memory(1234) == 1234
    assert 0 < parse_memory("10%") < parse_memory(None) * 0.5
    for bad in ("lots", "-1gb", 0, "5 parsecs"):
        with pytest.raises(ValueError):
            parse_memory(bad)


def test_concurrent_starts_make_one_server(cache_dir):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        started = list(pool.map(lambda _: EmbeddedRedis(cache_dir).start("16mb"), range(4)))
    assert started.count(True) == 1 and EmbeddedRedis(cache_dir).ping()
