"""Issue 46, items 9, 13 and 15: credentials in L2 URLs of every scheme (passwords holding
``/``, ``#``, ``@``), never printed; a wrong password backs off instead of connecting again
every batch; a connection the server closed costs no batch of misses.

Real redis-servers (a password, an ACL user, ``CLIENT KILL``, a restart), the real command line.
"""
from __future__ import annotations

import warnings

import pytest

from cachepipe import CacheWarning, TwoLevelCache
from cachepipe.l2.redis_url import canonical, redact
from cachepipe.l2.registry import canonical_url
from tools.cli import main as cli

SECRET = "s3cr/et#x@y"  # every character that ends a URL's user part early

# (url, its canonical name, (username, password)) for every scheme cachepipe registers
URLS = [
    (f"redis://:{SECRET}@Node1:6380/2", "redis://node1:6380/2", (None, SECRET)),
    (f"redis://admin:{SECRET}@node1/0?db=3", "redis://node1:6379/3", ("admin", SECRET)),
    ("redis://node1/0?password=a@b&db=1", "redis://node1:6379/1", (None, "a@b")),
    ("redis://admin:p%40ss@node1", "redis://node1:6379/0", ("admin", "p@ss")),
    (f"rediss://:{SECRET}@node1:6390", "rediss://node1:6390/0", (None, SECRET)),
    (f"unix://:{SECRET}@/run/redis.sock?db=4", "unix:///run/redis.sock?db=4", (None, SECRET)),
    ("unix:///tmp/a@b/redis.sock", "unix:///tmp/a@b/redis.sock?db=0", (None, None)),
    (f"redis-cluster://admin:{SECRET}@node1:7000", "redis-cluster://node1:7000", ("admin", SECRET)),
    ("redis-cluster://admin:hunter2@node1:7000", "redis-cluster://node1:7000", ("admin", "hunter2")),
]


@pytest.mark.parametrize("url,name,creds", URLS)
def test_every_scheme_parses_and_hides_its_credentials(url, name, creds):
    from cachepipe.l2.redis_url import connect_url, credentials

    assert canonical(url) == canonical_url(url) == name
    assert credentials(url) == creds
    shown = redact(url)
    assert (creds[1] is None or creds[1] not in shown) and "hunter2" not in shown and "s3cr" not in shown
    assert name.split("://", 1)[1].split(":")[0].split("?")[0] in shown.lower()  # the host is still named
    from redis.connection import parse_url

    if not url.startswith("redis-cluster"):  # a cluster gets them as arguments
        kw = parse_url(connect_url(url))  # what a redis-py client gets
        assert (kw.get("username"), kw.get("password")) == creds


def test_shm_urls_have_no_credentials_to_show():
    from cachepipe.l2.redis_url import credentials

    assert redact("shm:///dev/shm/x") == "shm:///dev/shm/x" and credentials("shm:///dev/shm/x") == (None, None)


def test_bad_db_is_one_line_without_the_password(source, tmp_path, capsys):
    for url in (f"redis://:{SECRET}@127.0.0.1/0?db=x", f"redis://:{SECRET}@127.0.0.1:port/0"):
        assert cli(["stats", str(source), "--cache-dir", str(tmp_path / "c"), "--l2", url]) == 2
        err = capsys.readouterr().err.strip()
        assert "--l2" in err or "Redis URL" in err
        assert len(err.splitlines()) == 1 and "s3cr" not in err and "Traceback" not in err


@pytest.fixture
def locked_server(redis_server):
    """``redis_server`` that requires :data:`SECRET` of its default user."""
    redis_server.client().config_set("requirepass", SECRET)
    return redis_server


def test_passwords_with_url_characters_authenticate(source, tmp_path, locked_server, capsys):
    server = locked_server
    urls = [f"redis://:{SECRET}@127.0.0.1:{server.port}/0",
            f"unix://:{SECRET}@{server.socket}?db=1"]
    for k, url in enumerate(urls):
        with TwoLevelCache(source, tmp_path / f"c{k}", [url], 32, use_l1=False) as cache:
            cache.get_many(range(len(cache)))
            cache.get_many(range(len(cache)))
            assert cache.stats()["l2_hits"] == len(cache) and cache.stats()["l2_errors"] == 0
        assert cli(["stats", str(source), "--cache-dir", str(tmp_path / f"c{k}"), "--l2", url,
                    "--cache-size", "32"]) == 0
        out = capsys.readouterr().out
        assert "24/24" in out and "s3cr" not in out


def _admin(server):
    import redis

    return redis.Redis(unix_socket_path=str(server.socket), password=SECRET, socket_timeout=5)


def _refusals(admin) -> int:
    """Connections made and error replies sent so far (a refused AUTH or command is one)."""
    stats = admin.info("stats")
    return int(stats["total_connections_received"]) + int(stats["total_error_replies"])


@pytest.mark.parametrize("kind", ["wrongpass", "noperm"])
def test_refused_credentials_back_off_and_warn_once(source, tmp_path, locked_server, kind):
    server = locked_server
    admin = _admin(server)
    if kind == "wrongpass":
        url = f"redis://:bad-pass-123@127.0.0.1:{server.port}/0"
    else:  # a user that may write but not read
        admin.execute_command("ACL", "SETUSER", "writer", "on", ">bad-pass-123", "~*", "+set", "+ping", "+info")
        url = f"redis://writer:bad-pass-123@127.0.0.1:{server.port}/0"
    with TwoLevelCache(source, tmp_path / "c", [url], 32) as cache:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cache.get_many(range(len(cache)))  # L1 filled
            start = _refusals(admin)
            for _ in range(30):
                assert all(x is not None for x in cache.get_many(range(8)))
            refusals = _refusals(admin) - start
        st = cache.stats()
    refused = [w for w in caught if issubclass(w.category, CacheWarning) and "refused cachepipe" in str(w.message)]
    assert len(refused) == 1 and st["l2_errors"] >= 1 and st["l1_hits"] >= 30 * 8
    assert refusals <= 6, f"{refusals} connections or refused commands for 30 batches: no backoff"
    assert "bad-pass-123" not in " ".join(str(w.message) for w in caught)


def test_a_closed_idle_connection_costs_no_batch(source, tmp_path, redis_server):
    url = redis_server.url
    with TwoLevelCache(source, tmp_path / "c", [url], 32) as cache:
        n = len(cache)
        cache.get_many(range(n))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            redis_server.client().execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            cache.get_many(range(n))
            st = cache.stats()
            assert st["l2_errors"] == 0 and st["l2_hits"] == n  # every sample from L2, once reconnected
            redis_server.kill()  # a restart: the same address, empty
            redis_server.start()
            cache.get_many(range(n))
            st = cache.stats()
        assert st["l2_errors"] == 0 and not [w for w in caught if "failed on" in str(w.message)]
        assert st["l2_misses"] == 2 * n  # the first fill, then the restarted (empty) server: misses, never errors
