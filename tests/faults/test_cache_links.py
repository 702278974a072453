"""Issue 17, item 5: links stay inside the root unless allowed, loops do not multiply
samples, cache files are private, non-UTF-8 names work."""
from __future__ import annotations

import argparse
import os
import shutil
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from cachepipe import CacheConfig, CacheWarning, Manifest, TwoLevelCache
from cachepipe.decode import decode_and_resize

ROOT = Path(__file__).resolve().parents[2]
SIZE = 32


def _cli(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools", *argv], cwd=ROOT, capture_output=True, timeout=180)


@pytest.fixture
def secret(tmp_path, tiny_dataset) -> Path:
    """A private JPEG outside the source, with bytes found nowhere in it."""
    d = tmp_path / "private"
    d.mkdir(mode=0o700)
    path = d / "secret.jpg"
    shutil.copy(next((tiny_dataset / "val").rglob("*.JPEG")), path)
    os.chmod(path, 0o600)
    return path


def test_link_out_of_the_root_is_skipped_unless_allowed(source, tmp_path, secret):
    cls = sorted(p for p in source.iterdir())[0]
    os.symlink(secret, cls / "secret.jpg")
    os.symlink(secret.parent, cls / "private_dir")
    r = _cli("warmup", str(source), "--cache-dir", str(tmp_path / "c"), "--no-l2", "--quiet")
    assert r.returncode == 0, r.stderr
    assert b"skipped 2 link(s)" in r.stderr and b"points outside the source root" in r.stderr
    l1 = next((tmp_path / "c").glob("*/l1"))
    assert secret.read_bytes() not in (l1 / "data.mdb").read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert len(Manifest.scan(source)) == 24
    r = _cli("warmup", str(source), "--cache-dir", str(tmp_path / "c"), "--no-l2", "--quiet",
             "--follow-external-links")
    assert r.returncode == 0 and b"skipped" not in r.stderr, r.stderr
    m = Manifest.scan(source, follow_external_links=True)
    assert len(m) == 26 and f"{cls.name}/secret.jpg" in m.relpaths


def test_follow_external_links_reaches_the_training_loaders(source, tmp_path, secret):
    from loaders import cached_dataloader
    from tools.train import configure

    cls = sorted(p for p in source.iterdir())[0]
    os.symlink(secret, cls / "secret.jpg")
    parser = argparse.ArgumentParser()
    configure(parser)
    assert parser.parse_args(["--follow-external-links"]).follow_external_links
    for follow, n in ((False, 24), (True, 25)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loader = cached_dataloader(source, batch_size=4, train=False, size=16, workers=0,
                                       cache_dir=tmp_path / "c", redis=False, cache_size=SIZE,
                                       follow_external_links=follow)
        assert len(loader.dataset) == n


def test_link_loop_and_links_to_other_classes_do_not_add_samples(source, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = Manifest.scan(source)
    a, b = sorted(p for p in source.iterdir())[:2]
    os.symlink("..", a / "loop")                 # a/loop -> ..  (the root)
    os.symlink(".", b / "self")                  # b/self -> .   (itself)
    os.symlink(os.path.join("..", a.name), b / "sibling")  # another class's folder
    (a / "sub").mkdir()
    os.symlink("..", a / "sub" / "up")           # back to its own class folder
    with pytest.warns(CacheWarning, match="skipped 4 link"):
        m = Manifest.scan(source)
    assert m.samples == plain.samples and m.fingerprint == plain.fingerprint
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with TwoLevelCache(source, tmp_path / "c", False, SIZE) as cache:
            assert len(cache) == 24 and cache.manifest.targets == plain.targets


def test_cache_files_are_private(source, tmp_path):
    cache_dir = tmp_path / "c"
    with TwoLevelCache(source, cache_dir, None, SIZE) as cache:  # the embedded Redis too
        try:
            cache.get_many(range(len(cache)))
            from cachepipe.warmup import warmup

            warmup(cache, progress=False)
            loose = [f"{p} {stat.filemode(p.lstat().st_mode)}" for p in [cache_dir, *cache_dir.rglob("*")]
                     if not p.is_symlink() and p.lstat().st_mode & 0o077]
            assert loose == []
            assert stat.S_IMODE((cache.l1_path / "data.mdb").stat().st_mode) == 0o600
        finally:
            cache.embedded_server().stop()


def test_non_utf8_names(source, tmp_path):
    some = next(source.rglob("*.JPEG"))
    bad_dir = os.fsencode(source) + b"/caf\xe9"
    os.mkdir(bad_dir)
    bad_file = bad_dir + b"/na\xefve\xff.jpg"
    shutil.copy(some, bad_file)
    for cmd in ("warmup", "stats"):
        r = _cli(cmd, str(source), "--cache-dir", str(tmp_path / "c"), "--no-l2", "--cache-size", str(SIZE))
        assert r.returncode == 0, (cmd, r.stderr)
    with TwoLevelCache(source, tmp_path / "c", False, SIZE) as cache:
        m = cache.manifest
        i = m.relpaths.index(os.fsdecode(b"caf\xe9/na\xefve\xff.jpg"))
        assert m.classes[m.targets[i]] == os.fsdecode(b"caf\xe9") and len(m) == 25
        np.testing.assert_array_equal(cache.get(i), decode_and_resize(some.read_bytes(), SIZE))
        assert cache.stats()["l1_hits"] == 1  # it was warmed under that name


def test_resume_with_another_link_setting_is_a_change(tmp_path):
    from trainer.recipes import load_recipe
    from trainer.run_config import RunConfig

    plain = RunConfig(recipe=load_recipe("demo"), data=str(tmp_path), out=str(tmp_path / "run"))
    following = RunConfig(recipe=load_recipe("demo"), data=str(tmp_path), out=str(tmp_path / "run"),
                          cache=CacheConfig(tmp_path, tmp_path / "c", follow_external_links=True))
    assert plain.changes(plain.settings()) == []
    assert following.changes(plain.settings()) == ["follow_external_links: '(unset)' -> True"]
