"""L2 stores register by URL scheme, with the scheme's own URL rule; the protocol declares
what a backend may leave out, with defaults (a whole backend: test_l2_backend_from_docs.py)."""
from __future__ import annotations

import numpy as np
import pytest

from cachepipe import CacheConfig
from cachepipe.l2.placement import LocalityError
from cachepipe.l2.registry import canonical_url, register_store, registered_schemes
from cachepipe.l2.spec import L2Spec, l2_setting, resolve_l2
from cachepipe.l2.store import SampleStore, glob_matcher, shard_row


def test_unknown_scheme_lists_the_registered_ones_without_the_password(source, cache_dir):
    with pytest.raises(ValueError) as info:
        CacheConfig(source, cache_dir, ["s3://user:hunter2@bucket/x"])
    message = str(info.value)
    assert "hunter2" not in message and "\n" not in message
    assert "unknown L2 URL scheme" in message and all(s in message for s in registered_schemes())
    assert {"shm://", "redis://", "redis-cluster://"} <= set(registered_schemes())


def test_the_l2_setting_is_resolved_once_into_one_kind():
    assert resolve_l2(None, servers=2).kind == "embedded" and resolve_l2(None, servers=2).servers == 2
    assert resolve_l2(False) == L2Spec.none() and not L2Spec.none().enabled
    assert resolve_l2("redis://h:6379/0").kind == "shards"
    assert resolve_l2(["redis-cluster://h:7000"]).kind == "cluster"
    assert resolve_l2("shm://", memory="64mb") == L2Spec("shm", ("shm://",), memory=64 << 20)
    assert resolve_l2("redis://h:6379/0", memory="64mb").memory is None  # sizes only the embedded and shm
    spec = resolve_l2(["redis://:secret@h:6379/0"])
    assert resolve_l2(spec) is spec and "secret" not in repr(spec)
    with pytest.raises(ValueError, match="cannot mix L2 kinds"):
        resolve_l2(["redis://h:1/0", "redis-cluster://h:2"])
    with pytest.raises(ValueError, match="cannot mix L2 kinds"):
        resolve_l2(["shm://", "redis://h:1/0"])
    with pytest.raises(ValueError, match="replicas applies to plain shards"):
        CacheConfig("/tmp/src", "/tmp/cache", ["redis-cluster://h:7000", "redis-cluster://g:7000"], replicas=2)
    with pytest.raises(ValueError, match="already"):
        register_store("shm", object, kind="shm")
    assert l2_setting(["shm://"], None) == ["shm://"] and l2_setting(None, False) is False
    with pytest.raises(ValueError, match="not both"):
        l2_setting(["shm://"], ["redis://h:1/0"])


def test_each_scheme_checks_its_own_urls():
    assert canonical_url("redis://H") == "redis://h:6379/0"
    assert canonical_url("shm://") == "shm://" and canonical_url("shm:///dev/shm//x/") == "shm:///dev/shm/x"
    with pytest.raises(ValueError, match="bad database number"):  # a Redis rule, for Redis URLs only
        canonical_url("redis://h:6379/db")
    for bad in ("shm://host/x", "shm://u:hunter2@/x", "shm:///x?size=1", "shm://relative"):
        with pytest.raises(ValueError, match="shm:// URL takes no host") as info:
            canonical_url(bad)
        assert "\n" not in str(info.value) and "hunter2" not in str(info.value)


def test_a_backend_must_have_the_abstract_methods_and_gets_the_declared_defaults():
    class Half(SampleStore):
        def get_many(self, indices):
            return [None] * len(indices)

    with pytest.raises(TypeError, match="abstract"):
        Half()
    names = ("put_many", "missing", "shard_info", "mark_partial", "partial", "scan", "drop", "close")
    Whole = type("Whole", (Half,), {name: lambda self, *a: None for name in names})
    store = Whole()
    assert store.owners([1, 2]) is None and tuple(store.health) == () and not store.node_local
    assert store.node_of([1, 2, 3], 1).tolist() == [0, 0, 0] and store.server_cpu_seconds() is None
    with pytest.raises(LocalityError, match="cannot tell which of 2 nodes"):
        store.node_of([1], 2)
    assert set(shard_row("x://y")) == {"url", "reachable", "used_memory", "maxmemory", "keys", "policy",
                                       "system_memory", "error", "denied"}
    with pytest.raises(ValueError, match="no key"):
        shard_row("x://y", colour="red")


def test_scan_globs_are_redis_globs():
    match = glob_matcher(r"cp:a\*b:[0-9]?:*")
    assert match(b"cp:a*b:1x:anything") and not match(b"cp:aXb:1x:") and not match(b"cp:a*b:x1:")
    assert glob_matcher("cp:[^a]*")(b"cp:b") and not glob_matcher("cp:[^a]*")(b"cp:a")
    assert np.array_equal([glob_matcher("k[12]")(k) for k in (b"k1", b"k2", b"k3")], [True, True, False])
