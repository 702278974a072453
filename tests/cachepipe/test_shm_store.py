"""The node-local L2 (``shm://``, NOTE [shm store]): zero-copy reads that outlive a rewrite,
its size and fixed subset, drop, a killed writer, a torn value, a reboot, two nodes, bad input."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from cachepipe import CacheWarning, TwoLevelCache
from cachepipe.coverage import coverage
from cachepipe.errors import L2UnavailableError
from cachepipe.l2.codec import decode_sample, encode_sample
from cachepipe.l2.placement import node_local_owner
from cachepipe.l2.shm_dir import path_of
from cachepipe.stale import drop
from cachepipe.warmup import warmup
from loaders import cached_dataloader

SIZE = 32


def _cache(source, cache_dir, url, **kw):
    return TwoLevelCache(source, cache_dir, l2=url, cache_size=SIZE, **{"l2_memory": "64mb", **kw})


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_reads_are_views_of_the_map_that_outlive_a_rewrite(source, cache_dir, shm_url):
    with _cache(source, cache_dir, shm_url) as cache:
        assert warmup(cache, progress=False)["l2_written"] == len(cache)
        first = cache.get_many([0, 1], copy=False)
        again = cache.get_many([0], copy=False)
        assert cache.stats()["l2_hits"] == 3 and not first[0].flags.writeable
        assert _address(first[0]) == _address(again[0])  # the same bytes twice: the map's, not copies
        maps = [line.split()[0].split("-") for line in Path("/proc/self/maps").read_text().splitlines()
                if line.endswith("/data.mdb") and str(path_of(shm_url)) in line]
        assert any(int(lo, 16) <= _address(first[0]) < int(hi, 16) for lo, hi in maps)
        before = first[0].copy()
        other = (255 - before).astype(np.uint8)  # sample 0 rewritten with other pixels
        assert cache.store.put_many([(0, encode_sample(0, other))]) == 1
        np.testing.assert_array_equal(first[0], before)  # its snapshot keeps the old pages (NOTE [pinned snapshots])
        np.testing.assert_array_equal(cache.get_many([0], copy=False)[0], other)


def test_a_partition_larger_than_the_store_is_a_fixed_subset_that_drop_frees(source, cache_dir, shm_url):
    with _cache(source, cache_dir, shm_url, l2_memory="96kb") as cache:
        n = len(cache)
        report = warmup(cache, progress=False)
        cached, uncached = report["l2_cached"], report["l2_uncached"]
        assert 0 < cached < n and cached + uncached == n and report["l2_write_errors"] == 0
        cov = coverage(cache)["l2"]
        shard = cov["shards"][0]
        assert cov["kind"] == "shm" and shard["maxmemory"] == 96 << 10 and shard["used_memory"] <= 96 << 10
        assert shard["keys"] == cached and shard["policy"] == "noeviction"
        assert [(r["present"], r["partial"]) for r in cov["sizes"]] == [(cached, {"0/1": uncached})]
        cache.get_many(range(n))
        stats = cache.stats()  # the rest from L1, and not written back (NOTE [fixed L2 subset])
        assert (stats["l2_hits"], stats["l1_hits"], stats["l2_writes"]) == (cached, n - cached, 0)
        old = cache.fingerprint
    first = next(source.glob("*/*"))
    (first.parent / "new.jpg").write_bytes(first.read_bytes())
    with _cache(source, cache_dir, shm_url, rescan=True) as cache:
        assert drop(cache)["l2_keys"] == cached
        assert not [p for p in path_of(shm_url).iterdir() if old in p.name]  # its environment is gone
        assert cache.store.shard_info()[0]["used_memory"] == 0


def test_a_writer_killed_mid_write_leaves_no_torn_value_and_the_next_one_writes(shm_url, tmp_path):
    from collections import Counter

    from cachepipe.l2.shm import ShmStore

    writer = textwrap.dedent(f"""
        import time, numpy as np
        from collections import Counter
        from cachepipe.l2.codec import encode_sample
        from cachepipe.l2.shm import ShmStore
        store = ShmStore([{shm_url!r}], namespace="t:", counters=Counter(), memory=256 << 20)
        rng = np.random.default_rng(0)
        batch = lambda b: [(i, encode_sample(i, rng.integers(0, 255, (128, 160, 3), dtype=np.uint8)))
                           for i in range(48 * b, 48 * (b + 1))]
        for b in range(3):  # committed
            store.put_many(batch(b))
        env = store._open(create=True)
        txn = env.begin(write=True, db=store._values)  # the fourth, killed holding the writer's lock
        for i, value in batch(3):
            txn.put(i.to_bytes(8, "big"), value[:len(value) // 2])
        print("inside", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    try:
        assert proc.stdout.readline() == "inside\n", "the writer died"
    finally:
        proc.send_signal(signal.SIGKILL)  # our own child
        proc.wait()
    store = ShmStore([shm_url], namespace="t:", counters=Counter())
    values = store.get_many(range(4 * 48))
    present = [i for i, v in enumerate(values) if v is not None]
    assert present == list(range(3 * 48))  # the killed transaction left nothing
    for i in present:
        decode_sample(values[i], i, copy=False)  # raises for a torn value
    good = encode_sample(0, np.zeros((32, 40, 3), dtype=np.uint8))
    assert store.put_many([(0, good)]) == 1  # the dead writer's lock is taken over
    assert bytes(store.get_many([0])[0]) == good


def test_a_torn_value_is_caught_and_filled_again_even_in_a_fixed_subset(source, cache_dir, shm_url):
    with _cache(source, cache_dir, shm_url) as cache:
        warmup(cache, progress=False)
        cache.store.mark_partial("0/1", 3)  # a fixed subset: misses are not written back, a torn value is
        good = bytes(cache.store.get_many([5])[0])
        cache.store.put_many([(5, good[:len(good) // 2] + bytes(len(good) - len(good) // 2))])
    with _cache(source, cache_dir, shm_url) as cache, pytest.warns(CacheWarning, match="corrupt L2 value for sample 5"):
        np.testing.assert_array_equal(cache.get(5), decode_sample(good, 5))
        assert cache.stats()["l2_corrupt"] == 1 and cache.stats()["l2_writes"] == 1
        assert bytes(cache.store.get_many([5])[0]) == good


def test_a_store_gone_with_its_tmpfs_is_a_cold_l2(source, cache_dir, shm_url):
    with _cache(source, cache_dir, shm_url) as cache:
        warmup(cache, progress=False)
    shutil.rmtree(path_of(shm_url))  # what a reboot leaves
    with _cache(source, cache_dir, shm_url) as cache, warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.store.shard_info()[0]["reachable"] and cache.store.missing([0, 1]) == [0, 1]
        cache.get_many(range(len(cache)))
        stats = cache.stats()
        assert (stats["l2_hits"], stats["l2_errors"], stats["l2_writes"]) == (0, 0, len(cache))
        assert warmup(cache, progress=False)["nothing_to_do"]


def test_two_nodes_warm_their_own_stores_and_node_local_ranks_read_them(source, cache_dir, shm_url):
    urls = [shm_url, shm_url + "-node1"]  # two nodes on one machine: each its own store
    try:
        for node, url in enumerate(urls):
            with _cache(source, cache_dir, url) as cache:
                n = len(cache)
                report = warmup(cache, node_rank=node, num_nodes=2, progress=False)
                home = node_local_owner(np.arange(n), 2)
                assert report["partition"] == report["l2_written"] == int((home == node).sum())
                assert cache.store.missing(range(n)) == np.flatnonzero(home != node).tolist()
        loader = cached_dataloader(source, cache_dir=cache_dir, l2=[urls[0]], cache_size=SIZE, batch_size=2,
                                   train=True, size=16, workers=2, distributed=(1, 4), local_size=2,
                                   locality="node", exchange_fraction=0.0)
        try:
            drawn = [i for request in loader.sampler for i in request]
            assert sum(1 for _ in loader) == len(loader)
            own = sum(1 for i in drawn if home[i] == 0)  # a rank of node 0: its store, read in the workers
            assert own > 0 and loader.cache_hits["l2_hits"] == own and loader.cache_hits["l1_hits"] == len(drawn) - own
        finally:
            loader.close()
    finally:
        shutil.rmtree(path_of(urls[1]), ignore_errors=True)


def _refused(source, cache_dir, url, match, **kw):
    """A store that may not be used: one line naming the URL for a check, L1 for reads."""
    with _cache(source, cache_dir, url, **kw) as cache:
        with pytest.raises(L2UnavailableError) as info:
            cache.store.missing([0])
        assert "\n" not in str(info.value) and f"L2 store shm://{path_of(url)}" in str(info.value)
        assert re.search(match, str(info.value)), str(info.value)
        with pytest.warns(CacheWarning, match=f"L2 store shm://{path_of(url)} failed on read"):
            np.testing.assert_array_equal(cache.get(3), TwoLevelCache(source, cache_dir, l2=False,
                                                                       cache_size=SIZE).get(3))
        assert cache.stats()["l2_errors"] >= 1 and cache.stats()["l2_hits"] == 0


def test_bad_stores_are_refused_in_one_line_and_reads_fall_back_to_l1(source, cache_dir, shm_url, tmp_path):
    path = path_of(shm_url)
    _refused(source, cache_dir, f"shm://{tmp_path}/l2", "is not on a tmpfs")
    size = os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize
    _refused(source, cache_dir, shm_url, "is more than the tmpfs holds.*--shm-size", l2_memory=size + (1 << 30))
    path.write_bytes(b"")  # a file where the store's directory should be: it cannot be written
    _refused(source, cache_dir, f"{shm_url}/sub", "cannot be written")
    path.unlink()
    path.mkdir()
    os.chown(path, 12345, 12345)  # made by another user
    _refused(source, cache_dir, shm_url, "belongs to uid 12345, not to this user")
    os.chown(path, os.geteuid(), os.getegid())
    with _cache(source, cache_dir, shm_url) as cache:
        warmup(cache, progress=False)
        where = next(p for p in path.iterdir() if p.is_dir())
    newer = f"import lmdb; e = lmdb.open({str(where)!r}, max_dbs=2); db = e.open_db(b'meta'); " \
            f"t = e.begin(write=True, db=db); t.put(b'format', b'99'); t.commit()"
    subprocess.run([sys.executable, "-c", newer], check=True)  # another process: this one has it open
    _refused(source, cache_dir, shm_url, "values of format 99, written by a newer cachepipe")
