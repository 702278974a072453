"""Issue 17, item 2: an L1 that cannot be opened or read is moved aside or bypassed;
reads fall back to L2 and the source; ``stats`` never writes."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from cachepipe import TwoLevelCache
from cachepipe.decode import decode_and_resize
from cachepipe.server.embedded import EmbeddedRedis
from tests.faults.cache_faults import needs_root, remount_ro, tmpfs

ROOT = Path(__file__).resolve().parents[2]
SIZE = 32


def _reference(source: Path, cache: TwoLevelCache) -> list[np.ndarray]:
    m = cache.manifest
    return [decode_and_resize(Path(m.path(i)).read_bytes(), SIZE) for i in range(len(m))]


def _fill(source, cache_dir, redis):
    with TwoLevelCache(source, cache_dir, redis, SIZE) as cache:
        ref = _reference(source, cache)
        cache.get_many(range(len(cache)))
        return ref, cache.l1_path


def _snapshot(root: Path) -> dict:
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def _stats(source, cache_dir, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools", "stats", str(source), "--cache-dir", str(cache_dir),
                           "--cache-size", str(SIZE), *extra], cwd=ROOT, capture_output=True, text=True, timeout=120)


_READ_ALL = """
import sys, warnings, numpy as np
from cachepipe import TwoLevelCache
from cachepipe.decode import decode_and_resize
src, cache_dir, redis = sys.argv[1], sys.argv[2], sys.argv[3] if sys.argv[3] != "none" else False
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    with TwoLevelCache(src, cache_dir, [redis] if redis else False, {size}) as cache:
        got = cache.get_many(range(len(cache)))
        for i, arr in enumerate(got):
            ref = decode_and_resize(open(cache.manifest.path(i), "rb").read(), {size})
            assert np.array_equal(arr, ref), i
        s = cache.stats()
print(s["l2_hits"], s["l1_hits"], s["l1_quarantined"], s["l1_errors"], len(got))
print("|".join(str(x.message) for x in w))
""".format(size=SIZE)


def _read_all(source, cache_dir, redis) -> list[str]:
    # in a child: a regression here is a SIGBUS, which must not take pytest down with it
    r = subprocess.run([sys.executable, "-c", _READ_ALL, str(source), str(cache_dir), redis or "none"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    return r.stdout.splitlines()


def test_truncated_l1_is_moved_aside_and_reads_come_from_l2(source, tmp_path, redis_server):
    cache_dir = tmp_path / "cache"
    _, l1 = _fill(source, cache_dir, [redis_server.url])
    os.truncate(l1 / "data.mdb", 16384)  # `truncate -s 16384 data.mdb`
    before = _snapshot(cache_dir)
    r = _stats(source, cache_dir, "--redis", redis_server.url)
    assert r.returncode == 0, r.stderr
    assert "truncated to 16384 bytes" in r.stdout and "L2      shards 32 px: 24/24" in r.stdout
    assert _snapshot(cache_dir) == before  # stats wrote nothing
    counts, messages = _read_all(source, cache_dir, redis_server.url)
    l2_hits, l1_hits, quarantined, l1_errors, n = map(int, counts.split())
    assert (l2_hits, quarantined, n) == (24, 1, 24)
    assert "moved it to" in messages and "truncated to 16384" in messages
    bad = [p for p in l1.parent.iterdir() if p.name.startswith("l1.bad-")]
    assert len(bad) == 1 and (bad[0] / "data.mdb").stat().st_size == 16384  # kept, not deleted


@pytest.mark.parametrize("with_l2", [True, False])
def test_garbage_header_reads_l2_or_the_source(source, tmp_path, redis_servers, with_l2):
    cache_dir = tmp_path / "cache"
    url = redis_servers(1)[0].url if with_l2 else None
    _, l1 = _fill(source, cache_dir, [url] if url else False)
    with open(l1 / "data.mdb", "r+b") as f:
        f.write(os.urandom(4096))
    r = _stats(source, cache_dir, *(["--redis", url] if url else ["--no-l2"]))
    assert r.returncode == 0 and "not an LMDB file" in r.stdout, r.stderr
    counts, messages = _read_all(source, cache_dir, url)
    assert counts.split()[2:] == ["1", "0", "24"] and "not an LMDB file" in messages
    assert counts.split()[0] == ("24" if url else "0")  # L2 held every sample
    if not url:  # the new mirror was refilled from the source: a second pass reads L1 only
        counts, _ = _read_all(source, cache_dir, None)
        assert counts.split()[:2] == ["0", "24"]


@needs_root()
def test_read_only_cache_dir_serves_l1_and_stats_works(source, tmp_path):
    with tmpfs(tmp_path / "ro", size="16m") as cache_dir:
        _fill(source, cache_dir, False)
        remount_ro(cache_dir)
        r = _stats(source, cache_dir, "--no-l2")
        assert r.returncode == 0, r.stderr
        assert "L1      24/24" in r.stdout and "Traceback" not in r.stderr
        counts, messages = _read_all(source, cache_dir, None)
        assert counts.split()[1:] == ["24", "0", "0", "24"]  # every sample from L1
        assert "cannot be written here" in messages
        r = subprocess.run([sys.executable, "-m", "tools", "warmup", str(source), "--cache-dir", str(cache_dir),
                            "--no-l2", "--cache-size", str(SIZE), "--quiet", "--rescan"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode in (3, 6) and "Traceback" not in r.stderr and str(cache_dir) in r.stderr


@needs_root()
def test_full_disk_reads_still_right(source, tmp_path, redis_server):
    with tmpfs(tmp_path / "full", size="2m") as cache_dir:
        with TwoLevelCache(source, cache_dir, [redis_server.url], SIZE) as cache:
            ref = _reference(source, cache)
            filler = cache_dir / "filler"
            with open(filler, "wb") as f:  # fill the disk to the last block
                try:
                    while True:
                        f.write(b"\0" * 65536)
                        f.flush()
                except OSError:
                    pass
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                got = cache.get_many(range(len(cache)))
            assert all(np.array_equal(a, b) for a, b in zip(got, ref))
            s = cache.stats()
            assert s["l1_write_errors"] + s["l1_errors"] > 0 and s["l2_writes"] == 24


@contextlib.contextmanager
def _embedded_stopped(cache_dir: Path):
    try:
        yield
    finally:
        EmbeddedRedis(cache_dir).stop()


def _fill_disk(path: Path) -> None:
    with open(path, "wb") as f:  # to the last block
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


@needs_root()
def test_warmup_on_a_full_disk_that_bypasses_l1_exits_6_not_nothing_to_do(source, tmp_path):
    """Issue 46, defect 6: L1 could not be opened ("No space left ... L1 is bypassed"), then "nothing
    to do: L1 and L2 already hold all ... samples", exit 0, while stats said L1 0/24."""
    warm = [sys.executable, "-m", "tools", "warmup", str(source), "--cache-size", str(SIZE), "--workers", "1",
            "--quiet"]  # the embedded L2, kept running between the warm-ups
    old = time.time() - 60  # a source not changed just now: its scan is reused, nothing is rewritten
    for d in [source, *(p for p in source.rglob("*") if p.is_dir())]:
        os.utime(d, (old, old))
    with tmpfs(tmp_path / "full", size="2m") as cache_dir, _embedded_stopped(cache_dir):
        r = subprocess.run([*warm, "--cache-dir", str(cache_dir)], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        l1 = next(cache_dir.glob("*/l1"))
        for p in l1.iterdir():  # the L1 is lost (a cleaned disk) while L2 keeps every sample
            p.unlink()
        l1.rmdir()
        _fill_disk(cache_dir / "filler")
        r = subprocess.run([*warm, "--cache-dir", str(cache_dir)], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 6, (r.stdout, r.stderr)
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("cachepipe warmup: error: ") and str(l1) in last and "No space left" in last
        assert "nothing to do" not in r.stdout and "Traceback" not in r.stderr
        (cache_dir / "filler").unlink()  # room again: the next warm-up refills L1 from the source
        r = subprocess.run([*warm, "--cache-dir", str(cache_dir)], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0 and "L1 written: 24 entries" in r.stdout, (r.stdout, r.stderr)
