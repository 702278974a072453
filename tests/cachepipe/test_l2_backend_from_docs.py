"""docs/cache.md, "Adding an L2 backend", is true: its code block, taken from the page as it
stands and run alone, is a third backend (beside Redis and shm://) over which the warm-up,
``stats``, ``drop`` and a ``cached_dataloader`` with worker processes all work."""
from __future__ import annotations

import re
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from cachepipe import CacheConfig, TwoLevelCache
from cachepipe.coverage import coverage
from cachepipe.l2.registry import registered_schemes
from cachepipe.l2.spec import L2Spec, resolve_l2
from cachepipe.stale import drop
from cachepipe.warmup import warmup
from loaders import cached_dataloader
from tools.cli import main

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cache.md"
SIZE = 32


def _docs_backend() -> types.ModuleType:
    """The page's backend, run once per process as the module ``dirstore`` (it registers ``dir://``)."""
    if "dirstore" not in sys.modules:
        section = DOCS.read_text().split("### Adding an L2 backend", 1)[1].split("\n### ", 1)[0]
        code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
        module = types.ModuleType("dirstore")
        exec(compile(code, "docs/cache.md (Adding an L2 backend)", "exec"), module.__dict__)
        sys.modules["dirstore"] = module
    return sys.modules["dirstore"]


@pytest.fixture
def dir_url(tmp_path):
    _docs_backend()
    return f"dir://{tmp_path / 'l2'}"


def test_the_documented_backend_serves_warmup_stats_drop_and_a_loader(source, cache_dir, dir_url, capsys):
    assert "dir://" in registered_schemes()
    config = CacheConfig(source, cache_dir, [dir_url], SIZE)
    assert config.l2.kind == "dir"
    with TwoLevelCache(config) as cache:
        n = len(cache)
        report = warmup(cache, progress=False)
        assert report["l2_written"] == n and report["l2_coverage"] == 1.0
        assert warmup(cache, progress=False)["nothing_to_do"]
        old = cache.fingerprint
        cov = coverage(cache, [SIZE])
    assert cov["l2"]["kind"] == "dir" and cov["l2"]["sizes"][0]["present"] == n
    assert cov["l2"]["shards"][0]["keys"] == n and cov["l2"]["shards"][0]["policy"] == ""
    # the CLI takes the registered scheme by --l2, as any other
    assert main(["stats", str(source), "--cache-dir", str(cache_dir), "--l2", dir_url, "--cache-size", str(SIZE)]) == 0
    assert f"L2      dir {SIZE} px: {n}/{n}" in capsys.readouterr().out

    # a loader with worker processes reads every sample from the store, with the pixels of no cache at all
    common = dict(batch_size=4, train=True, size=16, seed=3, drop_last=True)
    loader = cached_dataloader(source, cache_dir=cache_dir, l2=[dir_url], cache_size=SIZE, workers=2, **common)
    plain = cached_dataloader(source, cache=False, cache_size=SIZE, workers=0, **common)
    try:
        for (a, la), (b, lb) in zip(loader, plain):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
            assert la.tolist() == lb.tolist()
        assert loader.cache_hits["l2_hits"] == len(loader) * 4 and loader.cache_hits["source_reads"] == 0
    finally:
        loader.close()
        plain.close()

    # a changed source: the old fingerprint's keys are what drop frees
    shutil.copy(next(source.glob("*/*")), source / next(p.name for p in source.iterdir()) / "extra.jpg")
    with TwoLevelCache(source, cache_dir, l2=[dir_url], cache_size=SIZE, rescan=True) as cache:
        assert cache.fingerprint != old
        result = drop(cache)
        assert result["fingerprints"] == [old] and result["l2_keys"] == n
        assert coverage(cache, [SIZE])["l2"]["shards"][0]["keys"] == 0


def test_its_url_rule_is_its_own_and_it_is_not_sized(source, cache_dir, dir_url):
    with pytest.raises(ValueError, match=r"^L2 URL 'dir://relative': dir:// takes an absolute path"):
        CacheConfig(source, cache_dir, ["dir://relative"])
    assert resolve_l2([dir_url], memory="1gb").memory is None  # --l2-memory sizes only sized stores
    with pytest.raises(ValueError, match="memory applies to the embedded L2 and to sized stores"):
        L2Spec("dir", (dir_url,), memory=1 << 20)
