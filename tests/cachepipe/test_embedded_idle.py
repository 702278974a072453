"""Issue 46, defect 14: an embedded server stops by itself after an idle time without a client, and
when its cache dir is deleted; never while a cache (training, a loader worker) is connected to it."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from cachepipe import CacheConfig, TwoLevelCache
from cachepipe.l2.spec import L2Spec
from cachepipe.server.embedded import EmbeddedRedis
from cachepipe.server.identity import alive

SIZE = 32


def _watchers(directory: Path) -> list[int]:
    """Pids of the idle watchers of the server in ``directory``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"idle_watch.py") for a in argv) and os.fsencode(directory) in argv:
            found.append(int(pid))
    return found


def _gone(pid: int, directory: Path, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not alive(pid) and not _watchers(directory):
            return True
        time.sleep(0.05)
    return False


def test_a_server_nobody_uses_stops_after_its_idle_time(cache_dir):
    server = EmbeddedRedis(cache_dir, idle=0.5)
    assert server.start("16mb")
    pid = server.pid()
    assert len(_watchers(server.dir)) == 1
    assert _gone(pid, server.dir, within=5)  # no client for 0.5 s: it shut itself down, its watcher too
    assert not server.ping() and server.start() and server.ping()  # the next command starts it again
    assert server.stop() and _gone(server.pid() or pid, server.dir, within=2)


def test_a_server_a_cache_is_connected_to_is_never_stopped(source, cache_dir):
    config = CacheConfig(source, cache_dir, L2Spec.embedded(servers=1, idle=0.4), SIZE)
    with TwoLevelCache(config) as cache:
        want = cache.get_many(range(24))  # fills L2
        server = cache.embedded_server()
        pid = server.pid()
        for _ in range(2):
            time.sleep(0.8)  # twice the idle time between two batches: connected, not idle
            got = cache.get_many(range(24))
        assert server.pid() == pid and cache.stats()["l2_hits"] == 48
        assert all(np.array_equal(a, b) for a, b in zip(want, got))
    assert _gone(pid, server.dir, within=5)  # the cache closed: idle from then on


@pytest.mark.parametrize("what", ["cache dir", "server dir"])
def test_deleting_the_cache_dir_stops_its_server(tmp_path, what):
    cache_dir = tmp_path / "cache"
    server = EmbeddedRedis(cache_dir, idle=0)  # never idle: only the deletion stops it
    assert server.start("16mb")
    pid = server.pid()
    shutil.rmtree(cache_dir if what == "cache dir" else server.dir)
    assert _gone(pid, server.dir, within=8)


def test_the_idle_flag_is_checked(tmp_path):
    from tests.forked import run_tools

    from tools.cache_flags import idle_seconds

    res = run_tools("server", "start", "--cache-dir", tmp_path / "c", "--l2-idle", "-1")
    assert res.returncode == 2 and "--l2-idle '-1'" in res.stderr and res.stderr.count("\n") == 1
    assert not (tmp_path / "c").exists()
    for bad in ("soon", "inf", "nan"):
        with pytest.raises(ValueError, match=f"--l2-idle '{bad}': expected minutes >= 0"):
            idle_seconds(bad)
    assert idle_seconds("0.5") == 30 and idle_seconds(None) is None
    with pytest.raises(ValueError, match="--l2-idle"):
        L2Spec.embedded(idle=-1)
    with pytest.raises(ValueError, match="idle time applies to the embedded L2"):
        L2Spec("none", idle=60)
