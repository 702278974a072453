"""The binary manifest file: bad files are rescans (or one line naming them), never a crash or a wrong sample."""
from __future__ import annotations

import os
import pickle
import shutil
import struct
import warnings

import numpy as np
import pytest

from cachepipe import CacheWarning, Manifest, TwoLevelCache
from cachepipe.source.manifest_file import FILE_NAME, ManifestFile, ManifestFileError, read_root, write_manifest
from tests.cachepipe.conftest import reference_pixels


def _age_dirs(root, seconds=10):
    past = os.path.getmtime(root) - seconds
    for dirpath, _, _ in os.walk(root):
        os.utime(dirpath, (past, past))


@pytest.fixture
def saved(source, tmp_path):
    """(source, cache dir, the saved manifest, its file) with directory mtimes old enough to reuse."""
    _age_dirs(source)
    cache = tmp_path / "c"
    m = Manifest.load_or_scan(source, cache)
    return source, cache, m, cache / m.fingerprint / FILE_NAME


def _scans(monkeypatch):
    calls = []
    real = Manifest.scan.__func__
    monkeypatch.setattr(Manifest, "scan", classmethod(lambda cls, r, **kw: calls.append(r) or real(cls, r, **kw)))
    return calls


def _replace(path, data: bytes) -> None:
    """Put ``data`` at ``path`` as a new file (a torn copy, another program's file): editing the
    mapped file in place would change what the running test maps, which no cachepipe writer does."""
    tmp = path.with_name("tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _patch(path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset:offset + len(data)] = data
    _replace(path, bytes(raw))


@pytest.mark.parametrize("damage", ["truncated", "foreign", "format", "flipped", "empty"])
def test_unusable_file_is_a_rescan_that_rewrites_it(saved, monkeypatch, damage):
    source, cache, m, path = saved
    good = path.read_bytes()
    if damage == "truncated":
        _replace(path, good[:len(good) // 2])
    elif damage == "foreign":
        _replace(path, b'{"format": 2, "root": "/elsewhere"}' + bytes(500))
    elif damage == "format":
        _patch(path, 8, struct.pack("<I", 99))
    elif damage == "flipped":
        _patch(path, len(good) - 3, bytes([good[-3] ^ 0xFF]))  # inside the name blob
    else:
        _replace(path, b"")
    with pytest.raises(ManifestFileError, match=str(path)):
        ManifestFile.open(path)
    if damage == "format":
        with pytest.raises(ManifestFileError, match="format 99; this cachepipe reads format 3"):
            ManifestFile.open(path)
    calls = _scans(monkeypatch)
    again = Manifest.load_or_scan(source, cache)
    assert len(calls) == 1 and again.fingerprint == m.fingerprint and again.samples == m.samples
    assert Manifest.load(cache, m.fingerprint).samples == m.samples  # rewritten whole
    assert Manifest.load_or_scan(source, cache).file is not None and len(calls) == 1  # and reused again


def test_moved_root_is_rescanned_not_served_from_the_old_path(saved, tmp_path, monkeypatch):
    source, cache, m, path = saved
    moved = tmp_path / "moved"
    os.rename(source, moved)
    _age_dirs(moved)
    calls = _scans(monkeypatch)
    here = Manifest.load_or_scan(moved, cache)
    assert len(calls) == 1 and here.fingerprint == m.fingerprint and here.root == str(moved)
    assert read_root(path.parent) == str(moved) and here.path(0).startswith(str(moved))
    # a pointer of another root naming this manifest (a copied cache dir): not served
    pointers = sorted((cache / "sources").iterdir())
    shutil.copy(pointers[-1], pointers[0]) if len(pointers) > 1 else None
    os.rename(moved, source)
    _age_dirs(source)
    back = Manifest.load_or_scan(source, cache)
    assert back.root == str(source) and len(calls) == 2


def test_legacy_json_manifest_is_rescanned_once_keeping_its_fingerprint(saved, monkeypatch):
    source, cache, m, path = saved
    path.unlink()
    legacy = path.with_name("manifest.json")
    legacy.write_text('{"format":2,"root":' + f'"{m.root}"' + ',"fingerprint":"' + m.fingerprint + '"}')
    assert read_root(path.parent) == m.root  # stale listing reads its root from the first bytes
    calls = _scans(monkeypatch)
    again = Manifest.load_or_scan(source, cache)
    assert len(calls) == 1 and again.fingerprint == m.fingerprint and path.exists() and not legacy.exists()


def test_pickle_is_the_path_not_the_entries(saved, tmp_path):
    source, cache, m, path = saved
    blob = pickle.dumps(m)
    assert len(blob) < 2000 and str(path).encode() in blob
    back = pickle.loads(blob)
    assert back.file.path == path and back.samples == m.samples and back.targets == m.targets
    _patch(path, 72, b"\x01" * 8)  # another file under the same name that fails its checksum: refused
    with pytest.raises(ManifestFileError, match="fails its checksum"):
        pickle.loads(blob)
    unsaved = Manifest.scan(source)  # not saved: its arrays travel
    assert pickle.loads(pickle.dumps(unsaved)).samples == unsaved.samples


def test_ranks_that_scan_at_once_write_the_same_file(saved, tmp_path):
    source, cache, m, path = saved
    blob = pickle.dumps(m)
    other = Manifest.scan(source)  # another rank's scan, a moment later
    assert other.scanned_at != m.scanned_at
    write_manifest(path, {"root": other.root, "classes": other.classes}, other._cols, other.fingerprint)
    assert pickle.loads(blob).samples == m.samples  # the same bytes: its workers still open it
    elsewhere = Manifest.scan(source)
    elsewhere.root = str(tmp_path / "elsewhere")  # the same files under another root: another manifest
    write_manifest(path, {"root": elsewhere.root, "classes": other.classes}, other._cols, other.fingerprint)
    with pytest.raises(ManifestFileError, match="now holds .*elsewhere"):
        pickle.loads(blob)


def test_class_folder_of_100k_files(tmp_path, tiny_dataset):
    root = tmp_path / "big"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    jpeg = sorted((tiny_dataset / "train").rglob("*.JPEG"))[0]
    for k in range(100_000):  # hard links, a new inode every 60,000 (ext4 allows 65,000 links)
        if k % 60_000 == 0:
            first = shutil.copy(jpeg, root / "a" / f"{k:06d}.jpg")
        else:
            os.link(first, root / "a" / f"{k:06d}.jpg")
    shutil.copy(jpeg, root / "b" / "only.jpg")
    m = Manifest.scan(root)
    assert len(m) == 100_001 and m.relpaths[99_999] == "a/099999.jpg" and m.samples[-1] == ("b/only.jpg", 1)
    assert np.bincount(m.labels).tolist() == [100_000, 1]
    with TwoLevelCache(m, tmp_path / "c", False, 16) as cache:
        back = Manifest.load(tmp_path / "c", m.fingerprint)
        assert back.relpaths[54_321] == "a/054321.jpg" and back.file.path.stat().st_size < 100_001 * 64
        want = reference_pixels(jpeg.read_bytes(), 16)
        for i in (0, 77_777, 100_000):
            np.testing.assert_array_equal(cache.get(i), want)


def test_path_over_4kb_is_left_out_in_one_line_naming_it(source):
    plain = len(list(source.rglob("*.JPEG")))
    deep = os.open(sorted(source.iterdir())[0], os.O_RDONLY)
    depth = 0
    try:
        while depth < 21:  # 21 x 200 bytes: past PATH_MAX (4096), made with dir_fd since no path reaches it
            os.mkdir("d" * 200, dir_fd=deep)
            nxt = os.open("d" * 200, os.O_RDONLY, dir_fd=deep)
            os.close(deep)
            deep, depth = nxt, depth + 1
            if depth == 19:  # ~3.9 KB deep: a file whose path, not its folder's, passes 4 KB
                with open(os.open("f" * 250 + ".jpg", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=deep), "wb") as f:
                    f.write(b"not reached")
    finally:
        os.close(deep)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = Manifest.scan(source)
    assert len(m) == plain and all(len(m.path(i)) < 4096 for i in range(len(m)))
    lines = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
    assert any("cannot be stat'ed" in line and "File name too long" in line and "fff" in line for line in lines)
    assert all("\n" not in line for line in lines)
