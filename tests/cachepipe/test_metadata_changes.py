"""NOTE [metadata-only changes]: a chmod, a touch or an identical rewrite of the source costs
at most one read of each file and no second mirror; changed bytes are never served stale."""
from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

from cachepipe import TwoLevelCache
from cachepipe import l1_reuse
from cachepipe.source import reader
from cachepipe.warmup import warmup


@pytest.fixture
def reads(monkeypatch):
    real, counts = reader.read_stable, Counter()

    def counted(path, *args, **kwargs):
        counts[path] += 1
        return real(path, *args, **kwargs)

    monkeypatch.setattr(reader, "read_stable", counted)
    return counts


def _files(root) -> list[Path]:
    return [p for p in Path(root).rglob("*") if p.is_file()]


def _mirrors(cache_dir: Path) -> list[Path]:
    return sorted(p.parent for p in cache_dir.glob("*/l1*/data.mdb"))


def _l1_bytes(cache_dir: Path) -> int:
    return sum(f.stat().st_blocks * 512 for d in _mirrors(cache_dir) for f in d.iterdir())


def _warm(source, cache_dir, **kw):
    cache = TwoLevelCache(source, cache_dir, redis=False, cache_size=32, rescan=True, **kw)
    return cache, warmup(cache, progress=False)


def test_chmod_then_warmup_reuses_the_mirror_reading_each_file_once(source, tmp_path, reads):
    cache_dir = tmp_path / "cache"
    first, _ = _warm(source, cache_dir)
    first.close()
    before = _l1_bytes(cache_dir)
    for d, _, files in os.walk(source):  # chmod -R
        os.chmod(d, 0o750)
        for f in files:
            os.chmod(os.path.join(d, f), 0o640)
    reads.clear()
    cache, report = _warm(source, cache_dir)
    assert cache.fingerprint != first.fingerprint  # the identity changed (ctime)
    n = len(cache)
    assert report["l1_adopted"]["from"] == first.fingerprint
    assert report["l1_adopted"]["reused"] == report["l1_adopted"]["checked"] == n
    assert report["l1_written"] == 0 and cache.l1.entries() == n
    assert len(reads) == n and max(reads.values()) == 1  # at most one read of each file
    assert _mirrors(cache_dir) == [cache.l1_path] and _l1_bytes(cache_dir) <= before  # L1 did not grow
    assert warmup(cache, progress=False)["nothing_to_do"]
    values, _ = cache.l1.get_many(range(n))
    assert all(v == Path(cache.manifest.path(i)).read_bytes() for i, v in enumerate(values))
    cache.close()


def test_changed_bytes_under_a_touch_are_read_again_never_served_stale(source, tmp_path, reads):
    cache_dir = tmp_path / "cache"
    first, _ = _warm(source, cache_dir)
    victim = Path(first.manifest.path(5))
    other = Path(first.manifest.path(6)).read_bytes()
    first.close()
    st = victim.stat()
    replacement = (other + bytes(st.st_size))[:st.st_size]  # another image, padded to the old size
    tmp = victim.with_name(".swap")
    tmp.write_bytes(replacement)
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))  # the round-2 repro: same size, same mtime
    os.replace(tmp, victim)
    os.utime(victim.parent, ns=(victim.parent.stat().st_atime_ns, victim.parent.stat().st_mtime_ns))
    for p in _files(source):  # and a touch of everything else, bytes unchanged
        if p != victim:
            os.utime(p)
    assert len(_files(source)) == 24
    cache, report = _warm(source, cache_dir)
    adopted = report["l1_adopted"]
    assert adopted["replaced"] == 1 and adopted["reused"] == len(cache) - 1
    values, _ = cache.l1.get_many([5])
    assert values[0] == replacement
    cache.close()


def test_a_killed_adoption_resumes_and_a_new_file_is_a_fresh_mirror(source, tmp_path, reads, monkeypatch):
    cache_dir = tmp_path / "cache"
    first, _ = _warm(source, cache_dir)
    first.close()
    for p in _files(source):
        os.utime(p)
    real = l1_reuse._check

    def dies(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(l1_reuse, "_check", dies)
    with pytest.raises(KeyboardInterrupt):
        _warm(source, cache_dir)
    monkeypatch.setattr(l1_reuse, "_check", real)
    cache, report = _warm(source, cache_dir)  # resumes: every suspect checked, nothing lost
    assert report["l1_adopted"]["reused"] == len(cache) and report["l1_written"] == 0
    assert not (cache.l1_path.parent / "l1.adopting").exists()
    cache.close()
    shutil.copy(Path(source) / cache.manifest.relpath(0), Path(source) / cache.manifest.classes[0] / "new.jpg")
    grown, report = _warm(source, cache_dir)  # indices move: not adopted, mirrored afresh
    assert report["l1_adopted"] is None and report["l1_written"] == len(grown)
    grown.close()


def test_warmup_says_it_kept_the_mirror(source, tmp_path, capsys):
    from tools.cli import main as cli

    args = ["warmup", str(source), "--cache-dir", str(tmp_path / "cache"), "--no-l2", "--quiet", "--workers", "1"]
    assert cli(args) == 0
    for p in _files(source):
        os.chmod(p, 0o600)
    capsys.readouterr()
    assert cli(args + ["--rescan"]) == 0
    out = capsys.readouterr().out
    assert "kept the mirror of" in out and "24 files with a new identity read once, 24 unchanged" in out
