"""Recipes whose phases read caches of different sizes (NOTE [cache size per phase]), with a
real redis-server: each phase fills and reads its own namespace; the table shows L2's share."""
from __future__ import annotations

import dataclasses

import pytest

from cachepipe import CacheConfig, TwoLevelCache
from trainer.recipes import from_dict
from trainer.progress import format_row
from trainer.recipes import load_recipe
from trainer.run_config import RunConfig


def test_dawnbench28_reads_a_128_px_cache_in_its_small_phases():
    r = load_recipe("dawnbench28")
    assert [r.cache_size_of(p) for p in r.phases] == [128, 128, 320, 320]
    assert r.cache_sizes == (128, 320)


def test_a_phase_cache_smaller_than_its_crops_is_refused():
    data = load_recipe("demo").to_dict()
    data["phases"][0].update(size=64, cache_size=48)
    with pytest.raises(ValueError, match=r"phases\[0\]: phase cache_size must be 0 .* >= the phase's size \(64 px\)"):
        from_dict(data, "bad")


def test_each_phase_reads_its_own_cache_size(small_dataset, tmp_path, redis_server):
    from trainer.loop import train

    data = load_recipe("demo").to_dict()
    data["train"].update(cache_size=48, eval_size=32, workers=0)
    data["schedule"].update(warmup_epochs=0)
    phase = dict(data["phases"][0], epochs=1, size=32, batch_size=8, comm="dense")
    data["phases"] = [dict(phase, cache_size=36), dict(phase)]  # the second: train.cache_size
    recipe = from_dict(data, "two-sizes")
    cfg = RunConfig(recipe=recipe, data=str(small_dataset), out=str(tmp_path / "run"), loader="torch",
                    cache=CacheConfig(small_dataset, tmp_path / "cache", (redis_server.url,)), device="cpu",
                    print_table=False)
    rows = train(cfg)
    assert [row["cache_size"] for row in rows] == [36, 48]
    for row in rows:  # each phase started on an empty namespace: every read came from below L2
        assert row["cache"]["l2_hits"] == 0 and row["cache"]["l1_hits"] + row["cache"]["source_reads"] == 48
        assert " (0 %)" in format_row(row)
    for size in (36, 48):  # and filled it: both sizes now coexist in the one Redis
        with TwoLevelCache(small_dataset / "train", tmp_path / "cache", [redis_server.url], size) as cache:
            got = cache.get_many(range(len(cache)))
            assert cache.store.missing(range(len(cache))) == [] and cache.stats()["l2_hits"] == len(cache)
            assert {min(x.shape[:2]) for x in got} == {size}
    rows = train(dataclasses.replace(cfg, out=str(tmp_path / "again")))
    assert [row["cache"]["l2_hits"] for row in rows] == [48, 48]  # a second run reads both from L2
    assert " 48/0/0 (100 %) " in format_row(rows[0])
