"""Issue 32, item 8: what the L2 checksum protects, said truly: a value forged by anyone who
can write a sample's key is served (XXH3 is not keyed), and the Redis ACL is what keeps
such writers out. Real redis-server, real ACL users."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import redis

from cachepipe import TwoLevelCache
from cachepipe.l2.codec import encode_sample

DOCS = (Path(__file__).resolve().parents[2] / "docs" / "cache.md").read_text()


def test_a_forged_value_is_served_as_the_docs_say(source, tmp_path, redis_server):
    with TwoLevelCache(source, tmp_path / "cache", [redis_server.url], 32) as cache:
        real = cache.get(0)
        forged = np.full_like(real, 7)  # a valid header, checksum and shape: only a key could tell
        redis_server.client().set(cache.store.key(0), encode_sample(0, forged))
    with TwoLevelCache(source, tmp_path / "cache", [redis_server.url], 32) as cache:
        np.testing.assert_array_equal(cache.get(0), forged)
        assert cache.stats()["l2_hits"] == 1 and cache.stats()["l2_corrupt"] == 0
    security = DOCS[DOCS.index("## Security"):]
    assert "written by someone else under a sample's key is a miss" not in DOCS  # the old, false promise
    assert "The Redis ACL is the boundary, not the checksum" in security


def test_the_acl_keeps_other_writers_off_the_cache_keys(source, tmp_path, redis_server):
    admin = redis_server.client()
    admin.execute_command("ACL", "SETUSER", "other", "on", ">pw", "~other:*", "+set", "+get")
    with TwoLevelCache(source, tmp_path / "cache", [redis_server.url], 32) as cache:
        cache.get(0)
        key = cache.store.key(0)
    other = redis.Redis(host="127.0.0.1", port=redis_server.port, username="other", password="pw")
    with pytest.raises(redis.exceptions.NoPermissionError):
        other.set(key, b"forged")
    other.set("other:x", b"fine")  # its own keys only
