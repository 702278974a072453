"""Issue 17, item 3: warm-up stores only stable reads, retries transient errors without
recording them as corrupt, and re-checks recorded corrupt files.

A file rewritten after the scan, even byte for byte, has another identity (its ctime moved:
NOTE [file identity]), so it is served but not cached until a rescan gives it a new
fingerprint; the tests check that nothing half-written was ever stored and that the rescan
caches the file as it is."""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

from cachepipe import CorruptSampleError, TwoLevelCache
from cachepipe.decode import decode_and_resize
from cachepipe.warmup import known_corrupt, warmup
from tests.faults.cache_faults import eio, on_open

SIZE = 32


@pytest.fixture
def cache(source, tmp_path, redis_server):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with TwoLevelCache(source, tmp_path / "cache", [redis_server.url], SIZE) as c:
            yield c


def _check_all(cache):
    """Every sample equals the decode of the file as it is now; L1 holds its exact bytes."""
    m = cache.manifest
    got = cache.get_many(range(len(m)))
    values, bad = cache.l1.get_many(list(range(len(m))))
    assert bad == []
    for i in range(len(m)):
        data = Path(m.path(i)).read_bytes()
        assert values[i] == data, m.relpaths[i]
        np.testing.assert_array_equal(got[i], decode_and_resize(data, SIZE))


def _restore(path: Path, data: bytes, st: os.stat_result) -> None:
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _rescanned(cache, **kwargs) -> TwoLevelCache:
    """The same cache after a rescan of its source (a new fingerprint if a file changed)."""
    cache.close()
    cfg = cache.config
    return TwoLevelCache(cfg.source, cfg.cache_dir, cfg.l2, cfg.cache_size, rescan=True, **kwargs)


def test_file_caught_mid_write_is_read_again_not_stored(cache):
    path = Path(cache.manifest.path(5))
    data, st = path.read_bytes(), path.stat()

    def writer(n):  # a copy in progress: half the bytes, then the whole file back
        if n == 0:
            path.write_bytes(data[: len(data) // 2])
        elif n == 1:
            _restore(path, data, st)

    with on_open(path, writer) as calls:
        r = warmup(cache, progress=False)
    assert calls[0] >= 2 and r["corrupt"] == r["unreadable"] == [] and known_corrupt(cache) == set()
    assert r["changed"] == [cache.manifest.relpaths[5]]  # whole again, but written after the scan
    assert cache.l1.get_many([5])[0] == [None]  # the half file was never stored
    again = _rescanned(cache)
    warmup(again, progress=False)
    _check_all(again)


def test_file_that_never_settles_is_not_recorded_and_is_cached_later(cache):
    path = Path(cache.manifest.path(7))
    data, st = path.read_bytes(), path.stat()

    def churn(n):  # rewritten on every open: never the file the manifest describes
        path.write_bytes(data[: len(data) // (2 + n % 2)])

    with on_open(path, churn):
        r = warmup(cache, progress=False)
    rel = cache.manifest.relpaths[7]
    assert r["changed"] == [rel] and r["corrupt"] == [] and known_corrupt(cache) == set()
    assert cache.l1.get_many([7])[0] == [None]  # not stored under the old fingerprint
    _restore(path, data, st)
    cache = _rescanned(cache)
    again = warmup(cache, progress=False)
    assert not again["nothing_to_do"] and again["changed"] == []
    _check_all(cache)


def test_file_missing_for_a_moment_and_eio_are_retried(cache):
    moved = Path(cache.manifest.path(3))
    aside = moved.with_name(".replacing")

    def replace(n):  # `mv new old` done as unlink + rename: ENOENT in between
        if n == 0:
            os.rename(moved, aside)
        elif n == 1:
            os.rename(aside, moved)

    flaky = Path(cache.manifest.path(11))
    with on_open(moved, replace), on_open(flaky, eio(first=2)):
        r = warmup(cache, progress=False)
    assert r["corrupt"] == r["unreadable"] == [] and known_corrupt(cache) == set()
    assert r["changed"] == [cache.manifest.relpaths[3]]  # renamed back: a file put there after the scan
    assert cache.l1.get_many([11])[0][0] == Path(cache.manifest.path(11)).read_bytes()  # EIO, retried, stored
    cache = _rescanned(cache)
    warmup(cache, progress=False)
    _check_all(cache)


def test_persistent_eio_is_unreadable_not_corrupt(source, cache, tmp_path):
    path = Path(cache.manifest.path(2))
    with on_open(path, eio()):
        r = warmup(cache, progress=False)
        assert cache.get_many([2], errors="skip") == [None]  # never a wrong sample
        assert "Input/output error" in cache.last_errors[2]
    assert r["unreadable"] == [cache.manifest.relpaths[2]] and known_corrupt(cache) == set()
    assert "Input/output error" in r["unreadable_reasons"][cache.manifest.relpaths[2]]
    again = warmup(cache, progress=False)  # the disk is back
    assert again["l2_written"] == 1 and again["corrupt"] == []
    _check_all(cache)


def test_recorded_corrupt_file_is_rechecked_and_cleared(cache):
    path = Path(cache.manifest.path(4))
    data, st = path.read_bytes(), path.stat()
    bad = bytearray(data)
    bad[20: len(bad) - 20] = b"\0" * (len(bad) - 40)  # same size and mtime, garbage inside
    _restore(path, bytes(bad), st)
    cache = _rescanned(cache)  # its ctime moved: a new fingerprint
    m = cache.manifest
    r = warmup(cache, progress=False)
    assert r["corrupt"] == [m.relpaths[4]] and known_corrupt(cache) == {4}
    same = warmup(cache, progress=False)
    assert same["nothing_to_do"] and same["known_corrupt"] == [m.relpaths[4]] and same["corrupt"] == []
    _restore(path, data, st)  # the good file is back: another identity, another fingerprint
    cache = _rescanned(cache)
    fixed = warmup(cache, progress=False)
    assert fixed["corrupt"] == [] and known_corrupt(cache) == set()
    _check_all(cache)  # get() no longer raises CorruptSampleError


def test_file_recorded_too_large_is_recovered_under_a_larger_limit(cache):
    k = int(np.argmax(cache.manifest.sizes))
    big = int(cache.manifest.sizes[k])
    small = _rescanned(cache, max_file_bytes=big - 1)  # the limit is not in the fingerprint
    r = warmup(small, progress=False)
    assert r["corrupt"] == [small.manifest.relpaths[k]] and known_corrupt(small) == {k}
    with pytest.raises(CorruptSampleError, match="too large"):
        small.get(k)
    fixed = _rescanned(small)
    again = warmup(fixed, progress=False)  # recorded files are re-checked by every warm-up
    assert again["recovered"] == [fixed.manifest.relpaths[k]] and known_corrupt(fixed) == set()
    assert json.loads((fixed.l1_path.parent / "corrupt.json").read_text()) == []
    _check_all(fixed)
