"""Issue 32, item 2: a file replaced by another of the same size and mtime is never served stale.

Real files: a different JPEG padded to the original's size, the original's mtime copied
on (``os.utime(ns=...)``), ``os.replace``d over it; and a same-size rewrite within the same
second on a real ext2 file system with whole-second timestamps. Real redis-server for L2,
the real command line for the warm-up.
"""
from __future__ import annotations

import io
import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cachepipe import TwoLevelCache, decode_and_resize
from tests.faults.cache_faults import coarse_fs, needs_root
from tools.cli import main as cli

SIZE = 32
VICTIM = 5


def _impostor(path: Path) -> bytes:
    """Another image (flipped, inverted) as a JPEG padded to ``path``'s size."""
    original = path.read_bytes()
    img = Image.open(io.BytesIO(original)).convert("RGB").transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    img = Image.fromarray(255 - np.asarray(img))
    for quality in (75, 50, 25, 10):
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=quality)
        if buf.tell() <= len(original):
            return buf.getvalue() + b"\0" * (len(original) - buf.tell())  # bytes after EOI are ignored
    raise AssertionError("could not make a smaller JPEG")


def _replace_keeping_size_and_mtime(path: Path, data: bytes, keep_dir_mtime: bool = False) -> None:
    st, dst = path.stat(), path.parent.stat()
    tmp = path.with_name(".incoming")
    tmp.write_bytes(data)
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, path)
    if keep_dir_mtime:  # the directory looks untouched too: only a per-file check can tell
        os.utime(path.parent, ns=(dst.st_atime_ns, dst.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def _warmup(source: Path, cache_dir: Path, url: str, tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / "warmup.json"
    assert cli(["warmup", str(source), "--cache-dir", str(cache_dir), "--redis", url, "--cache-size", str(SIZE),
                "--workers", "1", "--quiet", "--json", str(out), *flags]) == 0
    return json.loads(out.read_text())


def _served(source: Path, cache_dir: Path, url: str | None) -> tuple[np.ndarray, dict]:
    """Sample VICTIM from L2 (``url``) or L1 (``url=None``), and the counters."""
    with TwoLevelCache(source, cache_dir, [url] if url else False, SIZE) as cache:
        return cache.get(VICTIM), cache.stats()


@pytest.mark.parametrize("flags,keep_dir_mtime", [(("--rescan", "--verify-files"), False),
                                                  (("--verify-files",), True), ((), False)])
def test_same_size_same_mtime_replacement_is_not_served_stale(source, tmp_path, redis_server, flags,
                                                              keep_dir_mtime):
    cache_dir = tmp_path / "cache"
    first = _warmup(source, cache_dir, redis_server.url, tmp_path)
    victim = sorted(source.rglob("*.JPEG"))[VICTIM]
    new = _impostor(victim)
    original = _original(first, cache_dir)  # before the warm-up below adopts that mirror (NOTE [metadata-only changes])
    _replace_keeping_size_and_mtime(victim, new, keep_dir_mtime)
    again = _warmup(source, cache_dir, redis_server.url, tmp_path, *flags)
    assert not again["nothing_to_do"] and again["fingerprint"] != first["fingerprint"]
    want = decode_and_resize(new, SIZE)
    assert not np.array_equal(want, decode_and_resize(original, SIZE))  # really another image
    from_l2, stats = _served(source, cache_dir, redis_server.url)
    assert stats["l2_hits"] == 1
    np.testing.assert_array_equal(from_l2, want)
    from_l1, stats = _served(source, cache_dir, None)
    assert stats["l1_hits"] == 1
    np.testing.assert_array_equal(from_l1, want)


def _original(report: dict, cache_dir: Path) -> bytes:
    """The victim's bytes as the first warm-up mirrored them into L1."""
    import lmdb

    with lmdb.open(str(cache_dir / report["fingerprint"] / "l1"), readonly=True, lock=False, max_dbs=2) as env:
        with env.begin(db=env.open_db(b"data", create=False)) as txn:
            return bytes(txn.get(VICTIM.to_bytes(8, "big")))


@needs_root()
def test_rewrite_in_the_same_second_on_a_coarse_file_system(tmp_path, tiny_dataset, redis_server):
    with coarse_fs(tmp_path / "ext2") as mnt:
        cls = mnt / "src" / "a"
        cls.mkdir(parents=True)
        files = sorted((tiny_dataset / "train").rglob("*.JPEG"))[:2]
        path = cls / "0.JPEG"
        (cls / "1.JPEG").write_bytes(files[1].read_bytes())
        old = files[0].read_bytes()
        new = _impostor(files[0])
        time.sleep(1.02 - time.time() % 1)  # just after a second boundary
        path.write_bytes(old)
        before = path.stat()
        writer = threading.Timer(0.3, path.write_bytes, (new,))  # in place, same size, same second
        writer.start()
        with TwoLevelCache(mnt / "src", tmp_path / "cache", [redis_server.url], SIZE) as cache:
            cache.get_many([0, 1])  # read, decoded and cached
        writer.join()
        after = path.stat()
        if (after.st_mtime_ns, after.st_ctime_ns) != (before.st_mtime_ns, before.st_ctime_ns):
            pytest.skip("the machine was too slow: the rewrite fell into the next second")
        with TwoLevelCache(mnt / "src", tmp_path / "cache", [redis_server.url], SIZE, verify="files") as cache:
            np.testing.assert_array_equal(cache.get(0), decode_and_resize(new, SIZE))
