"""An L1-only warm-up (``--no-l2``) reports the files it could not read, as one with L2
does: a share that goes away mid-warm-up must not end in "done" with half a mirror."""
from __future__ import annotations

from cachepipe import Manifest, TwoLevelCache
from cachepipe.config import CacheConfig
from cachepipe.warmup import warmup


def test_an_l1_only_warmup_lists_the_files_it_could_not_read(source, cache_dir):
    manifest = Manifest.scan(source)
    victim = source / manifest.relpaths[3]
    victim.unlink()  # gone after the scan: every read of it fails (ENOENT, retried, then given up)
    with TwoLevelCache(CacheConfig(source, cache_dir, l2=False), manifest=manifest) as cache:
        report = warmup(cache, progress=False)
    assert report["unreadable"] == [manifest.relpaths[3]]
    assert "No such file" in report["unreadable_reasons"][manifest.relpaths[3]]
    assert report["l1_written"] == len(manifest) - 1
