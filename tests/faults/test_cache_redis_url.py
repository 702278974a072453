"""Issue 17, item 8: URL spellings place keys alike, passwords never printed, a server
that is not Redis is exit 4 with its URL, impossible flag values are refused by name."""
from __future__ import annotations

import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from cachepipe import TwoLevelCache
from tests.redis_servers import free_port

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cret-pw"


def _cli(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_url_spellings_place_keys_on_the_same_shards(source, tmp_path, redis_servers):
    a, b = redis_servers(2)
    spelled = [f"redis://127.0.0.1:{a.port}/0", f"redis://127.0.0.1:{b.port}/0"]
    other = [f"redis://127.0.0.1:{a.port}", f"redis://127.0.0.1:{b.port}?db=0"]
    with TwoLevelCache(source, tmp_path / "c1", spelled, 32, use_l1=False) as cache:
        want = cache.get_many(range(len(cache)))
    with TwoLevelCache(source, tmp_path / "c2", other, 32, use_l1=False) as cache:
        got = cache.get_many(range(len(cache)))
        assert cache.stats()["l2_hits"] == len(cache) and cache.stats()["source_reads"] == 0
    assert all(np.array_equal(x, y) for x, y in zip(want, got))
    with pytest.raises(ValueError, match="duplicate shard"):
        TwoLevelCache(source, tmp_path / "c3", [spelled[0], other[0]], 32).store


def test_password_is_never_printed(source, tmp_path, redis_server):
    redis_server.client().config_set("requirepass", SECRET)
    url = f"redis://:{SECRET}@127.0.0.1:{redis_server.port}/0"
    out = []
    r = _cli("warmup", str(source), "--cache-dir", str(tmp_path / "c"), "--redis", url, "--cache-size", "32",
             "--quiet", "--workers", "1")
    assert r.returncode == 0, r.stderr
    out.append(r.stdout + r.stderr)
    r = _cli("stats", str(source), "--cache-dir", str(tmp_path / "c"), "--redis", url, "--cache-size", "32")
    assert r.returncode == 0 and "24/24" in r.stdout and ":***@127.0.0.1" in r.stdout
    out.append(r.stdout + r.stderr)
    with TwoLevelCache(source, tmp_path / "c", [url], 32, use_l1=False) as cache:
        out.append(repr(cache) + repr(cache.config))
        redis_server.kill()  # now every read fails and warns
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert all(x is not None for x in cache.get_many(range(len(cache))))
        out += [str(w.message) for w in caught]
    r = _cli("stats", str(source), "--cache-dir", str(tmp_path / "c"), "--redis", url, "--cache-size", "32")
    assert r.returncode == 4
    out.append(r.stdout + r.stderr)
    r = _cli("warmup", str(source), "--cache-dir", str(tmp_path / "c"), "--redis", url.replace("redis:", "redsi:"))
    assert r.returncode == 2
    out.append(r.stderr)
    text = "\n".join(out)
    assert SECRET not in text and "***" in text


@pytest.fixture
def http_server(tmp_path):
    """A real server that is not Redis: Python's HTTP server."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import socket

    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.kill()
    proc.wait()


def test_a_server_that_is_not_redis_is_exit_4(source, tmp_path, http_server):
    for cmd in ("warmup", "stats"):
        r = _cli(cmd, str(source), "--cache-dir", str(tmp_path / "c"), "--redis", http_server, "--cache-size", "32")
        assert r.returncode == 4, (cmd, r.stderr)
        assert "not a Redis server" in r.stderr and http_server in r.stderr and "Traceback" not in r.stderr
    with TwoLevelCache(source, tmp_path / "c", [http_server], 32) as cache:
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            got = cache.get_many(range(len(cache)))
        assert all(x is not None and x.shape[2] == 3 for x in got) and cache.stats()["l2_hits"] == 0


@pytest.mark.parametrize("flag,value", [("--l2-memory", "400%"), ("--l2-memory", "0"), ("--timeout", "nan"),
                                        ("--timeout", "-1"), ("--timeout", "inf")])
def test_impossible_values_are_refused_naming_the_flag(source, tmp_path, flag, value):
    for cmd in ("warmup", "stats"):
        r = _cli(cmd, str(source), "--cache-dir", str(tmp_path / "c"), flag, value)
        assert r.returncode == 2 and flag in r.stderr.strip().splitlines()[-1], r.stderr
