"""Manifest: torchvision ImageFolder ordering rules, fingerprint, cheap reuse."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from cachepipe import CacheWarning, Manifest
from tests.torchvision_reference import torchvision_image_folder


def _touch(path, data=b"x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_ordering_matches_imagefolder(tmp_path):
    root = tmp_path / "root"
    names = ["b/2.JPEG", "b/10.jpeg", "b/a.PNG", "b/notes.txt", "b/x.Jpg.bak", "a/z.webp",
             "a/sub-dir/1.jpg", "a/sub/2.jpg", "a/sub/deeper/0.tif", "a/.hidden.jpg",
             "B/upper.bmp", "c d/space.ppm", "a/sub/3.TIFF", "a/e.pgm"]
    for n in names:
        _touch(root / n)
    for k in ("k", "k2"):
        (tmp_path / "elsewhere" / k).mkdir(parents=True)
        _touch(tmp_path / "elsewhere" / k / "linked.jpg")
    os.symlink(tmp_path / "elsewhere" / "k", root / "linkcls")  # a symlinked class dir
    os.symlink(tmp_path / "elsewhere" / "k2", root / "a" / "via_link")  # symlinked subdir
    _touch(root / "stray.jpg")  # a file in the root is no class
    with pytest.warns(CacheWarning, match="skipped 2 link"):  # they leave the root
        inside = Manifest.scan(root)
    assert inside.classes == ["B", "a", "b", "c d"] and len(inside) == 12
    m = Manifest.scan(root, follow_external_links=True)
    classes, class_to_idx, instances = torchvision_image_folder(str(root))
    assert m.classes == classes == ["B", "a", "b", "c d", "linkcls"]
    assert m.class_to_idx == class_to_idx
    assert [(os.path.join(m.root, p), t) for p, t in m.samples] == instances
    assert m.targets == [t for _, t in instances]
    assert len(m) == len(instances) == 14
    assert "a/via_link/linked.jpg" in m.relpaths


def test_empty_root_and_empty_classes_raise(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="Couldn't find any class folder in .*found 0"):
        Manifest.scan(tmp_path / "empty")
    _touch(tmp_path / "flat" / "1.jpg")
    with pytest.raises(ValueError, match="Couldn't find any class folder in .*1.jpg"):
        Manifest.scan(tmp_path / "flat")
    _touch(tmp_path / "half" / "good" / "1.jpg")
    _touch(tmp_path / "half" / "bad" / "readme.txt")
    with pytest.raises(ValueError, match=r"^Found no valid file for the classes bad\. Supported extensions are: \.jpg, "):
        Manifest.scan(tmp_path / "half")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Manifest.scan(tmp_path / "missing")


def test_fingerprint_tracks_content_not_location(source, tmp_path):
    a = Manifest.scan(source)
    moved = tmp_path / "moved"
    os.rename(source, moved)
    b = Manifest.scan(moved)
    assert a.fingerprint == b.fingerprint and a.root != b.root
    f = moved / b.relpaths[3]
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert Manifest.scan(moved).fingerprint != a.fingerprint


def _age_dirs(root, seconds=10):
    """Make directory mtimes older than the racy window (see NOTE [manifest reuse])."""
    past = time.time() - seconds
    for dirpath, _, _ in os.walk(root):
        os.utime(dirpath, (past, past))


def test_reuse_without_rescan_and_change_detection(source, tmp_path, monkeypatch):
    cache = tmp_path / "c"
    _age_dirs(source)
    first = Manifest.load_or_scan(source, cache)
    scans = []
    real_scan = Manifest.scan.__func__
    monkeypatch.setattr(Manifest, "scan", classmethod(lambda cls, r, **kw: scans.append(r) or real_scan(cls, r, **kw)))
    again = Manifest.load_or_scan(source, cache)
    assert scans == [] and again.fingerprint == first.fingerprint and again.samples == first.samples
    # an in-place edit leaves directory mtimes alone: only verify="files" sees it
    victim = source / first.relpaths[0]
    st = victim.stat()
    victim.write_bytes(victim.read_bytes() + b"\0")
    os.utime(victim.parent, ns=(st.st_atime_ns, os.stat(victim.parent).st_mtime_ns))
    assert Manifest.load_or_scan(source, cache).fingerprint == first.fingerprint
    assert scans == []
    edited = Manifest.load_or_scan(source, cache, verify="files")
    assert len(scans) == 1 and edited.fingerprint != first.fingerprint
    # adding a file changes its directory's mtime: detected by the cheap check
    _age_dirs(source)
    Manifest.load_or_scan(source, cache)
    (source / first.classes[1] / "new.jpg").write_bytes(victim.read_bytes())
    added = Manifest.load_or_scan(source, cache)
    assert len(added) == len(first) + 1 and added.fingerprint != edited.fingerprint


def test_racy_directory_forces_rescan(source, tmp_path, monkeypatch):
    cache = tmp_path / "c"
    for dirpath, _, _ in os.walk(source):
        os.utime(dirpath)  # modified "now", like a directory written just before the scan
    Manifest.load_or_scan(source, cache)  # racy: the next call cannot trust these mtimes
    calls = []
    real_scan = Manifest.scan.__func__
    monkeypatch.setattr(Manifest, "scan", classmethod(lambda cls, r, **kw: calls.append(r) or real_scan(cls, r, **kw)))
    Manifest.load_or_scan(source, cache)
    assert len(calls) == 1


def test_save_load_round_trip(source, tmp_path):
    m = Manifest.scan(source)
    path = m.save(tmp_path / "c")
    assert path.name == "manifest.cpm" and m.file is not None  # the scan now serves from the mapped file
    back = Manifest.load(tmp_path / "c", m.fingerprint)
    assert back.samples == m.samples and back.classes == m.classes and back.fingerprint == m.fingerprint
    for col in ("labels", "sizes", "mtimes", "inos", "ctimes"):
        np.testing.assert_array_equal(getattr(back, col), getattr(m, col))
        assert not getattr(back, col).flags.writeable
    assert back.targets == m.targets == [t for _, t in m.samples] and back.total_bytes == int(m.sizes.sum())
    with pytest.raises(ValueError, match="verify"):
        Manifest.load_or_scan(source, tmp_path / "c", verify="everything")
