"""L2 stores register by URL scheme: a new backend is one class and one registration.

The backend here is a real (in-process, dict-backed) store written in this test module
alone; the cache reads and writes through it by its URL, and ``stats`` reports its kind.
"""
from __future__ import annotations

import fnmatch
from collections import Counter

import numpy as np
import pytest

from cachepipe import CacheConfig, TwoLevelCache
from cachepipe.coverage import coverage
from cachepipe.l2.registry import register_store, registered_schemes
from cachepipe.l2.spec import L2Spec, resolve_l2

SIZE = 32
_SPACES: dict[str, dict[str, bytes]] = {}  # URL -> its keys: what a server would hold


class DictStore:
    """An L2 backend keeping values in a process-wide dict per URL (one "shard" per URL)."""

    def __init__(self, urls, *, namespace: str, counters: Counter, replicas: int = 1, timeout: float = 1.0):
        self.space = _SPACES.setdefault(urls[0], {})
        self.namespace, self.counters, self.urls = namespace, counters, list(urls)

    def get_many(self, indices):
        return [self.space.get(f"{self.namespace}{i}") for i in indices]

    def put_many(self, items):
        for i, value in items:
            self.space[f"{self.namespace}{i}"] = bytes(value)
        return len(items)

    def missing(self, indices):
        return [i for i in indices if f"{self.namespace}{i}" not in self.space]

    @property
    def nodes(self) -> int:
        return 1

    def node_of(self, indices):
        return np.zeros(len(indices), dtype=np.int64)

    def shard_info(self):
        return [{"url": self.urls[0], "reachable": True, "used_memory": sum(map(len, self.space.values())),
                 "maxmemory": 0, "keys": len(self.space), "error": ""}]

    def mark_partial(self, node, uncached):
        pass

    def partial(self):
        return {}

    def scan(self, match):
        return iter([k.encode() for k in self.space if fnmatch.fnmatchcase(k, match)])

    def drop(self, match):
        keys = [k for k in self.space if fnmatch.fnmatchcase(k, match)]
        for k in keys:
            del self.space[k]
        return len(keys)

    def close(self):
        pass


register_store("dict", DictStore, kind="dict")


def test_a_registered_backend_serves_reads_and_writes_by_its_url(source, cache_dir):
    url = f"dict://{cache_dir.name}"
    config = CacheConfig(source, cache_dir, [url], SIZE)
    assert config.l2 == L2Spec("dict", (url,)) and config.l2.kind == "dict"
    with TwoLevelCache(config) as cache:
        first = cache.get_many(range(6))  # misses: decoded from the source, written to the store
        assert cache.stats()["l2_writes"] == 6 and len(_SPACES[url]) == 6
    with TwoLevelCache(config) as cache:
        again = cache.get_many(range(6))
        stats = cache.stats()
        assert stats["l2_hits"] == 6 and stats["l1_hits"] == 0 and stats["source_reads"] == 0
        for a, b in zip(first, again):
            np.testing.assert_array_equal(a, b)
        report = coverage(cache, [SIZE])
    assert report["l2"]["kind"] == "dict" and report["l2"]["sizes"][0]["present"] == 6


def test_unknown_scheme_lists_the_registered_ones_without_the_password(source, cache_dir):
    with pytest.raises(ValueError) as info:
        CacheConfig(source, cache_dir, ["s3://user:hunter2@bucket/x"])
    message = str(info.value)
    assert "hunter2" not in message and "\n" not in message
    assert "unknown L2 URL scheme" in message and all(s in message for s in registered_schemes())
    assert "dict://" in registered_schemes() and "redis-cluster://" in registered_schemes()


def test_the_l2_setting_is_resolved_once_into_one_kind():
    assert resolve_l2(None, servers=2).kind == "embedded" and resolve_l2(None, servers=2).servers == 2
    assert resolve_l2(False) == L2Spec.none() and not L2Spec.none().enabled
    assert resolve_l2("redis://h:6379/0").kind == "shards"
    assert resolve_l2(["redis-cluster://h:7000"]).kind == "cluster"
    spec = resolve_l2(["redis://:secret@h:6379/0"])
    assert resolve_l2(spec) is spec and "secret" not in repr(spec)
    with pytest.raises(ValueError, match="cannot mix L2 kinds"):
        resolve_l2(["redis://h:1/0", "redis-cluster://h:2"])
    with pytest.raises(ValueError, match="replicas applies to plain shards"):
        CacheConfig("/tmp/src", "/tmp/cache", ["redis-cluster://h:7000", "redis-cluster://g:7000"], replicas=2)
    with pytest.raises(ValueError, match="already"):
        register_store("dict", object, kind="dict")
