"""Issue 32, items 5 and 6: a FIFO named like an image never hangs a scan or a read, and one
huge file is one bad sample, never a ``MemoryError``.

Real FIFOs (``os.mkfifo``), a real 40 GB sparse file (``truncate``), the real command line
in a subprocess (bounded by a timeout and an address-space limit, so that the old
behaviour fails the test instead of hanging it or eating the machine), real redis-server.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from cachepipe import CacheWarning, CorruptSampleError, Manifest, TwoLevelCache
from loaders import CachedImageFolder

SIZE = 32


def _cli(*argv: str, timeout: float = 60, memory: int | None = None) -> subprocess.CompletedProcess:
    """``cachepipe ARGV`` in a subprocess; ``memory`` caps its address space (bytes)."""
    limit = (lambda: resource.setrlimit(resource.RLIMIT_AS, (memory, memory))) if memory else None
    return subprocess.run([sys.executable, "-m", "tools", *argv], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit, env={**os.environ, "PYTHONWARNINGS": "always"})


def _warm(source: Path, tmp_path: Path, url: str, *flags: str, **kwargs) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "warmup.json"
    proc = _cli("warmup", str(source), "--cache-dir", str(tmp_path / "cache"), "--redis", url, "--cache-size",
                str(SIZE), "--workers", "1", "--quiet", "--json", str(out), *flags, **kwargs)
    return proc, (json.loads(out.read_text()) if out.exists() else {})


_READ_THROUGH_A_FIFO = """
import json, os, sys, warnings
from pathlib import Path
from cachepipe import TwoLevelCache
from loaders import CachedImageFolder

src, cache_dir, url = sys.argv[1:]
folder = CachedImageFolder(src, cache=False, cache_size=32, on_error="skip")  # both scanned now
with TwoLevelCache(src, cache_dir, [url], 32) as cache:
    victim = Path(cache.manifest.path(3))
    victim.unlink()
    os.mkfifo(victim)  # a FIFO where the scan saw a JPEG
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = cache.get_many(range(6), errors="skip")
        samples, _, skipped = folder.load_many([2, 3, 4])
        why = cache.last_errors
    print(json.dumps({"missing": [k for k, x in enumerate(got) if x is None], "stats": cache.stats(), "why": why,
                      "skipped": skipped, "samples": len(samples), "warnings": [str(w.message) for w in seen]}))
"""


def test_a_fifo_in_the_source_is_left_out_of_the_scan_with_a_warning(source, tmp_path, redis_server):
    fifo = source / "class_0001" / "zz_pipe.JPEG"
    os.mkfifo(fifo)
    with pytest.warns(CacheWarning, match="1 source entry named like an image but not a regular file.*zz_pipe"):
        m = Manifest.scan(source)
    assert len(m) == 24 and not any("zz_pipe" in r for r in m.relpaths) and m.skipped_files == [str(fifo)]
    proc, report = _warm(source, tmp_path, redis_server.url)
    assert proc.returncode == 0, proc.stderr
    assert "not a regular file" in proc.stderr and report["samples"] == 24 and report["l2_written"] == 24


def test_a_file_replaced_by_a_fifo_after_the_scan_is_unreadable_not_a_hang(source, tmp_path, redis_server):
    proc = subprocess.run([sys.executable, "-c", _READ_THROUGH_A_FIFO, str(source), str(tmp_path / "cache"),
                           redis_server.url], capture_output=True, text=True, timeout=60)  # a hang fails here
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout)
    assert r["missing"] == [3] and r["stats"]["source_errors"] == 1  # the cache: unreadable, skipped
    assert set(r["skipped"]) == {3} and r["samples"] == 3  # the loader without a cache: replaced
    assert "not a regular file" in r["why"]["3"]  # what was wrong, said once by the loader that skips it
    assert any("not a regular file" in w for w in r["warnings"]), r["warnings"]


def test_a_40_gb_sparse_file_is_one_bad_sample_not_a_memory_error(source, tmp_path, redis_server):
    victim = sorted(source.rglob("*.JPEG"))[4]
    os.truncate(victim, 40 << 30)  # a JPEG header followed by 40 GB of holes: no disk used
    proc, report = _warm(source, tmp_path, redis_server.url, memory=6 << 30)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rel = str(victim.relative_to(source))
    assert report["corrupt"] == [rel] and report["l2_written"] == 23 and "MemoryError" not in proc.stderr
    again, report = _warm(source, tmp_path, redis_server.url, "--strict", memory=6 << 30)
    assert again.returncode == 1 and report["known_corrupt"] == [rel] and report["nothing_to_do"]


def test_the_size_limit_is_a_flag_and_the_skip_path_takes_it(source, tmp_path, redis_server):
    victim = sorted(source.rglob("*.JPEG"))[7]
    os.truncate(victim, 3 << 20)
    with TwoLevelCache(source, tmp_path / "cache", [redis_server.url], SIZE, max_file_bytes=1 << 20) as cache:
        with pytest.raises(CorruptSampleError, match="too large.*more than the 1 MiB"):
            cache.get(7)
        folder = CachedImageFolder(source, cache=cache, on_error="skip")
        with pytest.warns(RuntimeWarning, match=r"skipped \d bad sample"):
            samples, _, skipped = folder.load_many([6, 7, 8])
        assert set(skipped) == {7} and len(samples) == 3
    proc, _ = _warm(source, tmp_path, redis_server.url, "--max-file-size", "2%")
    assert proc.returncode == 2 and "--max-file-size '2%'" in proc.stderr


@pytest.mark.parametrize("l2", ["redis", "none"])
def test_files_over_the_size_limit_are_reported_with_or_without_l2(source, tmp_path, redis_server, l2):
    """Issue 46, defect 7: with ``--no-l2`` too-large files were skipped silently (rc 0 with --strict)."""
    victims = sorted(source.rglob("*.JPEG"))[3:5]
    for v in victims:
        os.truncate(v, 3 << 20)
    flags = ("--max-file-size", "1mb", "--strict") + (("--no-l2",) if l2 == "none" else ())
    url = redis_server.url
    out = tmp_path / "warmup.json"
    argv = ["warmup", str(source), "--cache-dir", str(tmp_path / "cache"), "--cache-size", str(SIZE),
            "--workers", "1", "--quiet", "--json", str(out), *flags] + (["--redis", url] if l2 == "redis" else [])
    proc = _cli(*argv)
    report = json.loads(out.read_text())
    rels = sorted(str(v.relative_to(source)) for v in victims)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert report["corrupt"] == rels and report["l1_written"] == 22 and all(r in proc.stdout for r in rels)
    again = _cli(*argv)
    assert again.returncode == 1 and json.loads(out.read_text())["known_corrupt"] == rels
