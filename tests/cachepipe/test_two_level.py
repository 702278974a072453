"""TwoLevelCache against real Redis servers: round trip, levels, failures, processes."""
from __future__ import annotations

import multiprocessing
import os
import pickle

import numpy as np
import pytest

from cachepipe import CacheWarning, CorruptSampleError, TwoLevelCache
from cachepipe.decode import DECODER_TAG
from cachepipe.l2.codec import encode_sample
from tests.cachepipe.conftest import reference_pixels, truncate

SIZE = 40


def _expected(cache, i):
    return reference_pixels(open(cache.manifest.path(i), "rb").read(), SIZE)


def test_round_trip_through_every_level(source, cache_dir, redis_server):
    with TwoLevelCache(source, cache_dir, [redis_server.url], SIZE) as cache:
        n = len(cache)
        first = cache.get_many(range(n))
        st = cache.stats()
        assert (st["l2_misses"], st["l1_misses"], st["source_reads"], st["l1_writes"], st["l2_writes"]) == (n, n, n, n, n)
        for i in range(n):
            np.testing.assert_array_equal(first[i], _expected(cache, i))
            assert min(first[i].shape[:2]) == SIZE and first[i].flags.writeable
        again = cache.get_many(range(n))
        assert cache.stats()["l2_hits"] == n
        redis_server.client().flushall()  # L2 lost: served by L1, refilled
        third = cache.get_many(range(n))
        st = cache.stats()
        assert st["l1_hits"] == n and st["source_reads"] == n and st["l2_writes"] == 2 * n
        for a, b, c in zip(first, again, third):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(a, c)
        views = cache.get_many(range(n), copy=False)
        assert cache.stats()["l2_hits"] == 2 * n and not views[0].flags.writeable
        np.testing.assert_array_equal(views[5], first[5])
        dup = cache.get_many([3, 3])
        assert dup[0] is not dup[1]
        np.testing.assert_array_equal(cache.get(3), first[3])
        with pytest.raises(IndexError):
            cache.get(n)


def test_cache_size_and_prefix_are_part_of_the_key(source, cache_dir, redis_server):
    with TwoLevelCache(source, cache_dir, redis_server.url, 32, prefix="p") as a, \
            TwoLevelCache(source, cache_dir, redis_server.url, 48, prefix="p") as b:
        assert min(a.get(0).shape[:2]) == 32 and min(b.get(0).shape[:2]) == 48
        keys = sorted(k.decode() for k in redis_server.client().keys("*"))
        assert keys == [f"p:{a.fingerprint}:32:{DECODER_TAG}:0", f"p:{a.fingerprint}:48:{DECODER_TAG}:0"]


def test_no_l2_mode(source, cache_dir):
    with TwoLevelCache(source, cache_dir, False, SIZE) as cache:
        np.testing.assert_array_equal(cache.get(1), _expected(cache, 1))
        assert cache.store is None and cache.stats()["l1_writes"] == 1


def test_replica_serves_when_a_shard_is_killed_mid_read(source, cache_dir, redis_servers):
    servers = redis_servers(3)
    with TwoLevelCache(source, cache_dir, [s.url for s in servers], SIZE, replicas=2) as cache:
        n = len(cache)
        expected = cache.get_many(range(n))
        cache.get_many(range(0, n // 2))
        servers[1].kill()
        with pytest.warns(CacheWarning, match="failed on read"):
            got = cache.get_many(range(n))
        st = cache.stats()
        assert st["l2_errors"] >= 1 and st["l2_fallbacks"] > 0
        assert st["source_reads"] == n  # nothing had to come from the source again
        for a, b in zip(expected, got):
            np.testing.assert_array_equal(a, b)
        calls = st["l2_errors"]
        cache.get_many(range(n))  # the dead shard is in backoff: skipped, not retried
        st = cache.stats()
        assert st["l2_errors"] == calls and st["l2_skipped"] > 0


def test_single_copy_shard_down_falls_back_to_l1(source, cache_dir, redis_servers):
    servers = redis_servers(2)
    with TwoLevelCache(source, cache_dir, [s.url for s in servers], SIZE) as cache:
        n = len(cache)
        expected = cache.get_many(range(n))
        servers[0].kill()
        with pytest.warns(CacheWarning):
            got = cache.get_many(range(n))
        st = cache.stats()
        assert st["l1_hits"] > 0 and st["source_reads"] == n and st["l2_hits"] + st["l1_hits"] == n
        for a, b in zip(expected, got):
            np.testing.assert_array_equal(a, b)
        servers[0].start()
        cache._store.health[0].retry_at = 0  # skip the backoff wait: the shard is back
        cache.get_many(range(n))
        assert cache._store.health[0].failures == 0
        assert len(servers[0].client().keys("*")) > 0  # refilled after recovery


def test_redis_out_of_memory_is_counted_not_fatal(source, cache_dir, redis_servers):
    server = redis_servers(1, maxmemory="1200kb")[0]
    with TwoLevelCache(source, cache_dir, server.url, 96) as cache:
        n = len(cache)
        with pytest.warns(CacheWarning, match="out of memory"):
            got = cache.get_many(range(n))
        st = cache.stats()
        assert st["l2_oom"] > 0 and st["l2_writes"] < n
        for i in range(n):
            np.testing.assert_array_equal(got[i], reference_pixels(open(cache.manifest.path(i), "rb").read(), 96))
        got2 = cache.get_many(range(n))
        assert cache.stats()["l2_hits"] == st["l2_writes"]
        assert all(np.array_equal(a, b) for a, b in zip(got, got2))


def test_corrupt_value_in_redis_is_a_miss_and_rewritten(source, cache_dir, redis_server):
    with TwoLevelCache(source, cache_dir, redis_server.url, SIZE) as cache:
        good = cache.get_many([0, 1, 2])
        client = redis_server.client()
        client.set(f"{cache.namespace}0", b"garbage")
        client.set(f"{cache.namespace}1", encode_sample(2, good[2]))  # another sample's value
        value = bytearray(client.get(f"{cache.namespace}2"))
        value[100] ^= 0xFF
        client.set(f"{cache.namespace}2", bytes(value))
        with pytest.warns(CacheWarning, match="corrupt L2 value"):
            got = cache.get_many([0, 1, 2])
        assert cache.stats()["l2_corrupt"] == 3
        for a, b in zip(good, got):
            np.testing.assert_array_equal(a, b)
        assert cache.get_many([0, 1, 2]) and cache.stats()["l2_hits"] == 3  # rewritten correctly


def test_truncated_jpeg_raises_or_skips(source, cache_dir, redis_server):
    with TwoLevelCache(source, cache_dir, redis_server.url, SIZE) as cache:
        victim = 5
        truncate(source / cache.manifest.relpaths[victim])
        rel = cache.manifest.relpaths[victim]
        with pytest.raises(CorruptSampleError, match=f"'{rel}', sample {victim}") as ei, \
                pytest.warns(CacheWarning, match="the source changed since it was scanned"):
            cache.get_many([4, victim, 6])
        assert ei.value.index == victim and ei.value.path == rel
        assert cache.stats()["l2_writes"] == 2  # the good ones were still cached
        out = cache.get_many([4, victim, 6], errors="skip")
        assert out[1] is None and out[0] is not None and out[2] is not None
        assert cache.stats()["corrupt"] == 2
        with pytest.raises(ValueError, match="errors must be"):
            cache.get_many([0], errors="ignore")


def test_changed_source_file_is_never_served_stale(source, cache_dir, redis_server):
    with TwoLevelCache(source, cache_dir, redis_server.url, SIZE) as cache:
        old = cache.get_many(range(len(cache)))
        fp = cache.fingerprint
    a, b = (source / cache.manifest.relpaths[i] for i in (0, 7))
    tmp = a.with_suffix(".tmp")
    tmp.write_bytes(b.read_bytes())
    os.replace(tmp, a)  # the usual "write then rename" replacement of file 0 by file 7's image
    with TwoLevelCache(source, cache_dir, redis_server.url, SIZE) as cache:
        assert cache.fingerprint != fp
        np.testing.assert_array_equal(cache.get(0), old[7])
        np.testing.assert_array_equal(cache.get(1), old[1])
        assert cache.stats()["source_reads"] == 2


def _worker_read(cache, indices):
    out = cache.get_many(indices)
    return [a.sum() for a in out], cache.stats()["pid"], cache.stats()["l2_hits"]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_usable_in_worker_processes(source, cache_dir, method):
    cache = TwoLevelCache(source, cache_dir, None, SIZE, l2_memory="64mb")  # embedded server
    sums = [a.sum() for a in cache.get_many(range(8))]
    state = pickle.dumps(cache)
    assert len(state) < 2000  # configuration only
    ctx = multiprocessing.get_context(method)
    with ctx.Pool(2) as pool:
        results = pool.starmap(_worker_read, [(cache, list(range(8))), (cache, list(range(8)))])
    for got, pid, hits in results:
        assert got == sums and pid != os.getpid() and hits == 8
    np.testing.assert_array_equal(cache.get(0).sum(), sums[0])  # parent handles still fine
    cache.close()


def test_bad_arguments(source, cache_dir):
    with pytest.raises(ValueError, match="unknown L2 URL scheme.*registered schemes: redis://"):
        TwoLevelCache(source, cache_dir, ["http://x"])
    with pytest.raises(ValueError, match="replicas must be in 1..1"):
        TwoLevelCache(source, cache_dir, ["redis://a:1/0"], replicas=2)
    with pytest.raises(ValueError, match="cache_size"):
        TwoLevelCache(source, cache_dir, False, 0)
    with pytest.raises(FileNotFoundError):
        TwoLevelCache(source / "nope", cache_dir, False)


def test_hung_shard_times_out_and_is_backed_off(source, cache_dir, redis_servers):
    import signal
    import time

    servers = redis_servers(2)
    with TwoLevelCache(source, cache_dir, [s.url for s in servers], SIZE, replicas=2, timeout=0.3) as cache:
        n = len(cache)
        expected = cache.get_many(range(n))
        servers[0].proc.send_signal(signal.SIGSTOP)  # alive but silent, like a wedged node
        try:
            with pytest.warns(CacheWarning, match="TimeoutError|Timeout"):
                got = cache.get_many(range(n))
            t0 = time.monotonic()
            again = cache.get_many(range(n))  # in backoff: no second timeout
            assert time.monotonic() - t0 < 0.3
        finally:
            servers[0].proc.send_signal(signal.SIGCONT)
        st = cache.stats()
        assert st["l2_errors"] == 1 and st["l2_skipped"] > 0 and st["source_reads"] == n
        for a, b, c in zip(expected, got, again):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(a, c)


def test_embedded_server_that_died_is_restarted(source, cache_dir):
    with TwoLevelCache(source, cache_dir, None, SIZE, l2_memory="32mb") as cache:
        expected = cache.get_many(range(6))
        cache.embedded_server().stop()  # e.g. `cachepipe server stop` during training
        with pytest.warns(CacheWarning, match="failed on read"):
            got = cache.get_many(range(6))  # served by L1 meanwhile
        cache._store.health[0].retry_at = 0  # the backoff window is over
        again = cache.get_many(range(6))
        assert cache.embedded_server().ping() and cache.stats()["l2_restarts"] == 1
        assert cache.get_many(range(6)) and cache.stats()["l2_hits"] == 6  # refilled
        for a, b, c in zip(expected, got, again):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(a, c)


def test_full_l1_map_warns_in_reads_and_fails_warmup(source, cache_dir):
    from cachepipe import L1FullError
    from cachepipe.warmup import warmup

    with TwoLevelCache(source, cache_dir, False, SIZE, l1_map_size=1 << 16) as cache:
        n = len(cache)
        with pytest.warns(CacheWarning, match="is full.*L1 writes are off"):
            got = cache.get_many(range(n))
        assert cache.stats()["l1_write_errors"] > 0
        for i in (0, n - 1):
            np.testing.assert_array_equal(got[i], _expected(cache, i))
        with pytest.raises(L1FullError, match="map size is 0.1 MiB"):
            warmup(cache, progress=False)
