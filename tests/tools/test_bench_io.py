"""``cachepipe bench io``: no cache, L1 and L1 + L2 over a slowfs share, and the benchmarks'
``--source-*`` flags (NOTE [slow source flags]). Rows and counts only: the figures are the
benchmark's (docs/benchmarks/io.md), never asserted here."""
from __future__ import annotations

import pytest

from tools.bench.harness.output import read_rows
from tools.cli import main as cli_main


@pytest.mark.fuse
def test_io_loads_the_same_epochs_from_each_level_of_a_slow_share(source, cache_dir, tmp_path, shm_url, capsys):
    out = tmp_path / "io.json"
    assert cli_main(["bench", "io", str(source), "--cache-dir", str(cache_dir), "--batch-size", "4", "--size", "32",
                     "--cache-size", "40", "--rounds", "1", "--workers", "1", "--source-latency-ms", "2",
                     "--also-l2", shm_url, "--shm-memory", "64mb", "--json", str(out)]) == 0
    # (a store of this test's own, not a fresh shm:// of the run: another test checks that none of those is left)
    rows = {r["cache"]: r for r in read_rows(out)}
    assert list(rows) == ["none", "l1", "l1+l2", "l1+l2 (shm 1)"]
    assert rows["none"]["source_reads_per_image"] == 1 and rows["none"]["l1_hits_per_image"] == 0  # every epoch
    assert rows["l1"]["source_reads_per_image"] == 0 and rows["l1"]["l1_hits_per_image"] == 1
    for name in ("l1+l2", "l1+l2 (shm 1)"):
        assert rows[name]["l2_hits_per_image"] == 1 and rows[name]["source_reads_per_image"] == 0
    assert all(r["source_latency_ms"] == 2 and r["source_mbps"] == 100 for r in rows.values())
    assert rows["none"]["speedup"] == 1 and rows["none"]["io_reduction"] == 1
    text = capsys.readouterr().out
    assert "cachepipe slowfs over" in text and "the share served" in text and "targets (the seed's Fig. 9)" in text


def test_io_and_the_slow_source_flags_refuse_bad_values_in_one_line(source, cache_dir, capsys):
    for argv, words in ((["io", "--source-mbps", "-1"], "--source-mbps -1"),
                        (["io", "--no-l2"], "--no-l2"), (["io", "--rounds", "0"], "--rounds must be >= 1"),
                        (["cache", "--source-latency-ms", "-2"], "--source-latency-ms -2")):
        assert cli_main(["bench", argv[0], str(source), "--cache-dir", str(cache_dir), *argv[1:]]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err


@pytest.mark.fuse
def test_bench_cache_reads_its_source_through_slowfs_when_asked(source, cache_dir, tmp_path, capsys):
    out = tmp_path / "cache.json"
    assert cli_main(["bench", "cache", str(source), "--cache-dir", str(cache_dir), "--samples", "8", "--workers",
                     "1", "--repeat", "1", "--batch-size", "4", "--source-latency-ms", "1", "--source-mbps", "50",
                     "--json", str(out)]) == 0
    assert "source read from: slowfs (1 ms per read, 1 ms per metadata operation, 50 MB/s shared)" in \
        capsys.readouterr().out
    assert {r["level"] for r in read_rows(out)} == {"source", "l1", "l2"}
