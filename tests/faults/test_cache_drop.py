"""Issue 46, items 1-4, 15 and 17: ``cachepipe drop`` never takes another source's namespace,
a namespace in use or a glob of another prefix, checks everything before it deletes, and
no cache dir entry that is a link is followed.

Real redis-servers, the real command line in this process (``tools.cli.main``), a real
loader in another process, a real read-only mount.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cachepipe import TwoLevelCache
from tests.faults.cache_faults import needs_root, remount_ro, tmpfs
from tools.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]


def _warm(src, cache_dir, url, prefix="cachepipe") -> str:
    """Every sample of ``src`` into L1 and L2 (32 px); the fingerprint."""
    with TwoLevelCache(src, cache_dir, [url], 32, prefix=prefix) as cache:
        cache.get_many(range(len(cache)))
        return cache.fingerprint


def _keys(server, prefix: str, fp: str) -> int:
    head = f"{prefix}:{fp}:".encode()
    return sum(k.startswith(head) for k in server.client().scan_iter(count=1000))  # no glob: the test's own count


def _new_version(src: Path) -> None:
    """One more file: a new fingerprint, found by a scan (its directory changed)."""
    first = sorted(src.rglob("*.JPEG"))[0]
    shutil.copy(first, first.with_name("zz_new.JPEG"))


def test_another_sources_namespace_is_never_dropped(tiny_dataset, tmp_path, redis_server, capsys):
    data = tmp_path / "data"
    shutil.copytree(tiny_dataset, data)
    cache, url = tmp_path / "cache", redis_server.url
    old_val = _warm(data / "val", cache, url)
    _new_version(data / "val")
    val = _warm(data / "val", cache, url)  # val's current one, and an older one of val
    train = _warm(data / "train", cache, url)
    flags = ["--cache-dir", str(cache), "--l2", url]
    for fp, why in ((val, "current one of another source"), (old_val, "namespace of another source")):
        assert cli(["drop", str(data / "train"), *flags, "--fingerprint", fp]) == 2
        err = capsys.readouterr().err.strip()
        assert why in err and str(data / "val") in err and len(err.splitlines()) == 1
        assert _keys(redis_server, "cachepipe", fp) == (9 if fp == val else 8) and (cache / fp / "manifest.cpm").exists()
    assert cli(["drop", str(data / "val"), *flags, "--fingerprint", old_val]) == 0  # named by its own source
    assert _keys(redis_server, "cachepipe", old_val) == 0
    assert _keys(redis_server, "cachepipe", val) == 9 and _keys(redis_server, "cachepipe", train) == 24


def test_prefixes_with_glob_characters_are_matched_literally(source, tmp_path, redis_server, capsys):
    cache, url = tmp_path / "cache", redis_server.url
    prefixes = ["exp1", "exp[1]", "*"]
    old = [_warm(source, cache, url, p) for p in prefixes][0]
    _new_version(source)
    new = _warm(source, cache, url, "exp1")
    flags = ["--cache-dir", str(cache), "--l2", url, "--cache-size", "32", "--json"]
    assert cli(["stats", str(source), *flags, "--prefix", "exp[1]"]) == 0
    import json

    rows = json.loads(capsys.readouterr().out)["l2"]["sizes"]
    assert [r["present"] for r in rows] == [0]  # exp1's new keys are not exp[1]'s
    assert cli(["drop", str(source), *flags, "--prefix", "exp[1]"]) == 0
    assert json.loads(capsys.readouterr().out)["l2_keys"] == 24
    assert _keys(redis_server, "exp[1]", old) == 0  # its own are gone ...
    assert _keys(redis_server, "exp1", old) == 24 and _keys(redis_server, "exp1", new) == 25  # ... exp1's stay
    assert cli(["drop", str(source), *flags, "--prefix", "*", "--fingerprint", old]) == 0
    assert json.loads(capsys.readouterr().out)["l2_keys"] == 24
    assert _keys(redis_server, "*", old) == 0 and _keys(redis_server, "exp1", old) == 24


_LOADER = r"""
import os, pathlib, sys
from loaders import cached_dataloader
src, cache, url, ready, stop = sys.argv[1:6]
loader = cached_dataloader(src, batch_size=4, train=False, size=32, workers=1, cache_dir=cache, l2=[url],
                           cache_size=32, distributed=False)
epochs = 0
while not pathlib.Path(stop).exists():
    for _ in loader:
        pass
    epochs += 1
    pathlib.Path(ready + ".tmp").write_text(str(epochs))
    os.replace(ready + ".tmp", ready)
"""


def test_a_namespace_in_use_is_not_dropped(source, tmp_path, redis_server, capsys):
    cache, url = tmp_path / "cache", redis_server.url
    ready, stop = tmp_path / "ready", tmp_path / "stop"
    run = subprocess.Popen([sys.executable, "-c", _LOADER, str(source), str(cache), url, str(ready), str(stop)],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()[0]
            time.sleep(0.05)
        with TwoLevelCache(source, cache, [url], 32, save_manifest=False) as probe:
            old = probe.fingerprint
        _new_version(source)  # the run's namespace is an older version now
        flags = ["--cache-dir", str(cache), "--l2", url]
        assert cli(["drop", str(source), *flags]) == 5
        err = capsys.readouterr().err.strip()
        assert "in use" in err and old in err and len(err.splitlines()) == 1
        assert _keys(redis_server, "cachepipe", old) == 24 and (cache / old / "manifest.cpm").exists()
        epochs = int(ready.read_text())
        while int(ready.read_text()) < epochs + 1:  # the run goes on reading its namespace
            assert run.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        stop.touch()
        out = run.communicate(timeout=120)[0]
    assert run.returncode == 0, out
    assert cli(["drop", str(source), *flags]) == 0  # the run is over: its namespace goes, all of it
    assert _keys(redis_server, "cachepipe", old) == 0 and not (cache / old).exists()


def test_a_leftover_server_dir_does_not_hide_the_running_server(source, tmp_path, capsys):
    cache = tmp_path / "cache"
    flags = ["--cache-dir", str(cache), "--cache-size", "32", "--workers", "1", "--quiet"]
    try:
        assert cli(["warmup", str(source), *flags, "--l2-servers", "2"]) == 0
        assert cli(["server", "stop", "--cache-dir", str(cache)]) == 0  # leaves redis-1/
        assert (cache / "redis-1").is_dir()
        with TwoLevelCache(source, cache, None, 32, l2_servers=1) as c:
            c.get_many(range(len(c)))
            old = c.fingerprint
        _new_version(source)
        assert cli(["warmup", str(source), *flags, "--l2-servers", "1"]) == 0
        capsys.readouterr()
        assert cli(["stats", str(source), "--cache-dir", str(cache), "--l2-servers", "1"]) == 0
        assert "25/25 (100.0 %)" in capsys.readouterr().out
        assert cli(["drop", str(source), "--cache-dir", str(cache), "--l2-servers", "1"]) == 0
        assert "24 L2 keys" in capsys.readouterr().out
        client = TwoLevelCache(source, cache, None, 32, l2_servers=1).embedded_server().client()
        assert [k for k in client.scan_iter(count=1000) if old.encode() in k] == []
    finally:
        cli(["server", "stop", "--cache-dir", str(cache)])


def _two_versions(source, cache, url) -> str:
    old = _warm(source, cache, url)
    _new_version(source)
    _warm(source, cache, url)
    return old


def test_a_symlinked_namespace_is_refused_before_any_key_goes(source, tmp_path, redis_server, capsys):
    cache, url = tmp_path / "cache", redis_server.url
    old = _two_versions(source, cache, url)
    elsewhere = tmp_path / "elsewhere"
    (cache / old).rename(elsewhere)
    (cache / old).symlink_to(elsewhere)
    assert cli(["drop", str(source), "--cache-dir", str(cache), "--l2", url]) == 6
    err = capsys.readouterr().err.strip()
    assert "symbolic link" in err and "nothing was dropped" in err and len(err.splitlines()) == 1
    assert _keys(redis_server, "cachepipe", old) == 24 and (elsewhere / "manifest.cpm").exists()


@needs_root()
def test_a_read_only_cache_dir_is_refused_before_any_key_goes(source, tmp_path, redis_server, capsys):
    url = redis_server.url
    with tmpfs(tmp_path / "ro", size="16m") as cache:
        old = _two_versions(source, cache, url)
        remount_ro(cache)
        assert cli(["drop", str(source), "--cache-dir", str(cache), "--l2", url]) == 6
        err = capsys.readouterr().err.strip()
        assert "read-only" in err and "nothing was dropped" in err and len(err.splitlines()) == 1
        assert _keys(redis_server, "cachepipe", old) == 24 and (cache / old / "manifest.cpm").exists()


def test_symlinked_cache_dir_entries_are_never_written_through(source, tmp_path, capsys):
    cache, target = tmp_path / "cache", tmp_path / "target"
    for entry in ("redis", "sources"):
        (target / entry).mkdir(parents=True)
        (target / entry / "redis.pid").write_text("1")
        os.chmod(target / entry, 0o755)
        cache.mkdir(exist_ok=True)
        (cache / entry).symlink_to(target / entry)
    for action in ("stop", "start", "status"):
        assert cli(["server", action, "--cache-dir", str(cache)]) == 2
        err = capsys.readouterr().err.strip()
        assert "symbolic link" in err and len(err.splitlines()) == 1
    (cache / "redis").unlink()
    with pytest.raises(PermissionError, match="symbolic link"):
        TwoLevelCache(source, cache, False, 32)  # the pointer would go into target/sources
    (cache / "sources").unlink()
    fp = TwoLevelCache(source, tmp_path / "probe", False, 32, save_manifest=False).fingerprint
    (target / fp).mkdir()
    shutil.rmtree(cache / fp)  # the manifest went in before the pointer was refused
    (cache / fp).symlink_to(target / fp)
    with pytest.raises(PermissionError, match="symbolic link"):
        TwoLevelCache(source, cache, False, 32)
    assert sorted(os.listdir(target / "redis")) == ["redis.pid"] and os.listdir(target / fp) == []
    assert (target / "redis").stat().st_mode & 0o777 == 0o755 and os.listdir(target / "sources") == ["redis.pid"]
