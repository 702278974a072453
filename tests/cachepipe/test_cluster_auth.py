"""Issue 46, item 9: a Redis Cluster that needs a user and password (``redis-cluster://
admin:PASSWORD@host:port``) is authenticated, and the password is never printed."""
from __future__ import annotations

import warnings

from cachepipe import TwoLevelCache
from cachepipe.warmup import warmup
from tools.cli import main as cli

SECRET = "hun/ter#2@x"


def test_cluster_credentials_authenticate_and_stay_hidden(source, cache_dir, redis_cluster, capsys):
    url, clients, _ = redis_cluster
    for c in clients:  # only admin may connect now
        c.execute_command("ACL", "SETUSER", "admin", "on", f">{SECRET}", "~*", "&*", "+@all")
        c.execute_command("ACL", "SETUSER", "default", "off")
    seed = url.replace("redis-cluster://", f"redis-cluster://admin:{SECRET}@")
    with TwoLevelCache(source, cache_dir, seed, 32) as cache:
        assert warmup(cache, progress=False)["l2_written"] == len(cache)
        assert all(x is not None for x in cache.get_many(range(len(cache))))
        assert cache.stats()["l2_hits"] == len(cache) and SECRET not in repr(cache) + repr(cache.config)
    assert cli(["stats", str(source), "--cache-dir", str(cache_dir), "--l2", seed, "--cache-size", "32"]) == 0
    out = capsys.readouterr()
    assert "24/24" in out.out and "hun/" not in out.out + out.err
    wrong = url.replace("redis-cluster://", "redis-cluster://admin:not-it-9@")
    with TwoLevelCache(source, cache_dir, wrong, 32) as cache, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert all(x is not None for x in cache.get_many(range(len(cache))))  # from L1
    assert cli(["stats", str(source), "--cache-dir", str(cache_dir), "--l2", wrong, "--cache-size", "32"]) == 4
    text = " ".join(str(w.message) for w in caught) + capsys.readouterr().err
    assert "not-it-9" not in text and "admin:***@" in text
