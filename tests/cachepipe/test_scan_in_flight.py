"""The scan's system calls in flight (NOTE [scan in flight]): the same manifest, warnings
and order whatever the pool size and whichever thread finishes first."""
from __future__ import annotations

import os
import random
import threading
import time
import warnings

import pytest

from cachepipe.source import listing
from cachepipe.source.manifest import Manifest


def _tree(root):
    """Classes with nested folders, links inside and outside the root, a loop and a
    second link to one directory: every decision of NOTE [symlinks in the source]."""
    rng = random.Random(7)
    for c in range(6):
        for d in ("", "x", "x/y", "z"):
            folder = root / "data" / f"c{c}" / d
            folder.mkdir(parents=True, exist_ok=True)
            for k in range(rng.randrange(1, 6)):
                (folder / f"f{k}.jpg").write_bytes(os.urandom(rng.randrange(1, 64)))
            (folder / "notes.txt").write_text("not an image")
    data = root / "data"
    (root / "outside").mkdir()
    (root / "outside" / "o.jpg").write_bytes(b"o")
    os.symlink(root / "outside", data / "c0" / "out")  # leaves the root
    os.symlink(data / "c1" / "x", data / "c2" / "again")  # a second path to c1/x
    os.symlink(data / "c3", data / "c3" / "z" / "loop")  # a loop
    os.symlink(data / "c4" / "x" / "y", data / "c4" / "a_first")  # walked before its real path
    os.symlink(data / "c5" / "f0.jpg", data / "c5" / "z" / "file_link.jpg")
    os.symlink(data / "gone.jpg", data / "c5" / "dangling.jpg")
    return data


def _scan(root, threads):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        m = Manifest.scan(root, scan_threads=threads)
    return m, sorted(str(w.message) for w in seen)


def _same(a, b):
    assert a.classes == b.classes
    assert list(a.relpaths) == list(b.relpaths)
    assert a.labels.tolist() == b.labels.tolist()
    for f in ("sizes", "mtimes", "inos", "ctimes"):
        assert getattr(a, f).tolist() == getattr(b, f).tolist()
    assert a.dir_mtimes == b.dir_mtimes
    assert a.fingerprint == b.fingerprint


def test_pool_scan_equals_serial_scan_whatever_finishes_first(tmp_path, monkeypatch):
    data = _tree(tmp_path)
    serial, serial_warnings = _scan(data, 1)
    assert len(serial) > 30 and "c4/a_first/f0.jpg" in serial.relpaths  # the replayed DFS decided as always
    assert not any(r.startswith("c1/x/") for r in serial.relpaths if r.startswith("c2/"))
    real_stat, lock = os.stat, threading.Lock()
    rng = random.Random(1)

    def slow_stat(path, *args, **kwargs):  # completion order shuffled: later calls often finish first
        with lock:
            delay = rng.random() * 0.003
        time.sleep(delay)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(listing.os, "stat", slow_stat)
    for threads in (4, 32):
        pooled, pooled_warnings = _scan(data, threads)
        _same(serial, pooled)
        assert pooled_warnings == serial_warnings
    assert any("points outside the source root" in w for w in serial_warnings)
    assert any("already walked" in w for w in serial_warnings)


def test_pool_overlaps_the_latency_of_its_calls(tmp_path, monkeypatch):
    """With 2 ms per stat, 240 files and 12 folders take ~0.5 s one at a time; 32 in
    flight take a fraction of it."""
    for c in range(12):
        (tmp_path / f"c{c:02d}").mkdir()
        for k in range(20):
            (tmp_path / f"c{c:02d}" / f"{k}.jpg").write_bytes(b"x")
    Manifest.scan(tmp_path)  # settled: the files are older than the racy window after this
    time.sleep(0.06)
    real_stat = os.stat

    def slow_stat(path, *args, **kwargs):
        time.sleep(0.002)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(listing.os, "stat", slow_stat)
    t0 = time.perf_counter()
    Manifest.scan(tmp_path, scan_threads=32)
    pooled = time.perf_counter() - t0
    assert pooled < 0.25, f"{pooled:.2f} s: the stats did not overlap"


def test_scan_threads_must_be_positive(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.jpg").write_bytes(b"x")
    with pytest.raises(ValueError, match="scan_threads"):
        Manifest.scan(tmp_path, scan_threads=0)
