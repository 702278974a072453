"""The scale benchmark's measuring functions (``tools/bench/parts/scale_*.py``), at a tiny N."""
from __future__ import annotations

import json
import math
import os

import pytest

from tools.bench.parts.scale_measure import growth, run_command
from tools.bench.harness.proc_memory import memory
from tools.bench.parts.scale_tree import build_tree, parse_count


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


def test_memory_and_run_command():
    me = memory()
    assert 0 < me["uss"] <= me["rss"] and me["pss"] > 0 and 0 < me["anon"] <= me["rss"]
    r = run_command(["sh", "-c", "sleep 0.5 & sleep 0.5; wait"])
    assert r["rc"] == 0 and r["max_rss"] > 0 and r["seconds"] >= 0.5 and r["children_max_uss"] > 0


def test_growth():
    assert growth(10, 1.0, 100, 10.0) == pytest.approx(1.0)
    assert growth(10, 2.0, 100, 2.0) == pytest.approx(0.0)
    assert math.isnan(growth(10, 0.0, 100, 1.0))


def test_bench_scale_at_a_tiny_n(tmp_path, capsys):
    from tools.cli import main

    out = tmp_path / "scale.json"
    assert main(["bench", "scale", "--files", "30,60", "--dir", str(tmp_path / "s"), "--contexts", "fork",
                 "--workers", "1", "--batches", "3", "--batch-size", "4", "--cache-size", "16", "--image-px", "16",
                 "--l1-files", "40", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["files"] for r in doc["rows"]] == [30, 60] and all(not r["failed"] for r in doc["rows"])
    first = doc["rows"][0]
    assert first["construct_fork_s"] > 0 and first["worker_uss_fork_mb"] > 0 and first["warmup_files_per_s"] > 0
    growth, l1 = doc["tables"]
    assert growth["rows"][0]["from"] == 30 and l1["rows"][0]["entries"] == 40 and l1["rows"][0]["rc"] == 0
    assert "growth exponent" in capsys.readouterr().out
    assert main(["bench", "scale", "--files", "60,30"]) == 2  # sizes must increase
