"""The scale benchmark's measuring functions (``tools/scale/``), at a tiny N."""
from __future__ import annotations

import math
import os

import pytest

from tools.scale.measure import growth, measure_tree, run_command
from tools.scale.proc_memory import children, memory
from tools.scale.tree import build_tree, parse_count


def test_parse_count():
    assert (parse_count("500"), parse_count("10k"), parse_count("1.28M"), parse_count("2M")) == (
        500, 10_000, 1_281_167, 2_000_000)
    for bad in ("", "ten", "0", "-3k"):
        with pytest.raises(ValueError, match="file count"):
            parse_count(bad)


def test_trees_are_hard_links_with_their_own_inodes(tmp_path):
    a = build_tree(tmp_path / "a", 50, classes=4, side=8)
    b = build_tree(tmp_path / "b", 50, classes=4, side=8)
    files = sorted(p for p in a.rglob("*.JPEG"))
    assert len(files) == 50 and len({p.parent.name for p in files}) == 4
    assert len({p.stat().st_ino for p in files}) == 4  # one JPEG per class folder
    assert not {p.stat().st_ino for p in files} & {p.stat().st_ino for p in b.rglob("*.JPEG")}
    mtime = os.stat(a / ".complete").st_mtime_ns
    assert build_tree(a, 50, classes=4, side=8) == a and os.stat(a / ".complete").st_mtime_ns == mtime  # reused
    with pytest.raises(ValueError, match="files >= 1"):
        build_tree(tmp_path / "c", 0)


def test_memory_and_children():
    me = memory()
    assert 0 < me["uss"] <= me["rss"] and me["pss"] > 0
    r = run_command(["sh", "-c", "sleep 0.5 & sleep 0.5; wait"])
    assert r["rc"] == 0 and r["max_rss"] > 0 and r["seconds"] >= 0.5
    assert children(1 << 22) == []  # no such process


def test_growth():
    assert growth(10, 1.0, 100, 10.0) == pytest.approx(1.0)
    assert growth(10, 2.0, 100, 2.0) == pytest.approx(0.0)
    assert math.isnan(growth(10, 0.0, 100, 1.0))


def test_measure_tree_at_a_tiny_n(tmp_path):
    tree = build_tree(tmp_path / "tree", 40, classes=4, side=16)
    r = measure_tree(tree, tmp_path / "work", cache_size=16, workers=1, batches=3, batch_size=4, contexts=("fork",))
    assert all(r[k]["rc"] == 0 for k in ("scan", "warmup", "warmup_again", "stats")), r
    assert r["warmup_rate"] > 0 and r["manifest_bytes"] > 0
    fork = r["loader"]["fork"]
    assert fork["batches"] == 3 and fork["construct_s"] > 0 and len(fork["worker_after"]) == 1
    assert fork["worker_after"][0]["uss"] > 0 and "rss" in fork["rank_built"]
