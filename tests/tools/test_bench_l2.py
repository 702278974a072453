"""``cachepipe bench l2`` and ``bench cache --also-l2``: Redis and shm:// through their
resolved specs, side by side in one run (NOTE [L2 side by side])."""
from __future__ import annotations

from pathlib import Path

from tools.bench.harness.output import read_rows
from tools.cli import main


def test_bench_l2_reads_every_config_through_its_store(tmp_path, capsys):
    out = tmp_path / "l2.json"
    assert main(["bench", "l2", "--configs", "1,shm", "--clients", "1", "--values", "8", "--batch", "4",
                 "--value-kb", "16", "--seconds", "0.3", "--rounds", "1", "--json", str(out)]) == 0
    rows = {r["config"]: r for r in read_rows(out)}
    assert set(rows) == {"1", "shm"} and all(r["samples"] > 0 and r["gb_per_s"] > 0 for r in rows.values())
    assert rows["shm"]["servers"] == 0 and rows["shm"]["server_us_per_sample"] == 0  # no server: readers only
    assert rows["1"]["servers"] == 1 and rows["1"]["us_per_sample"] >= rows["1"]["client_us_per_sample"]
    assert "shm:" in capsys.readouterr().out and not list(Path("/dev/shm").glob("cachepipe-bench-l2-*"))


def test_bench_cache_measures_the_embedded_redis_and_shm_in_the_same_rounds(source, cache_dir, tmp_path):
    out = tmp_path / "cache.json"
    assert main(["bench", "cache", str(source), "--cache-dir", str(cache_dir), "--cache-size", "32", "--samples",
                 "8", "--workers", "1", "--repeat", "1", "--also-l2", "shm://", "--shm-memory", "64mb",
                 "--json", str(out)]) == 0
    rows = read_rows(out)
    assert [(r["level"], r["store"]) for r in rows] == [("source", "-"), ("l1", "-"), ("l2", "embedded"),
                                                        ("l2", "shm")]
    assert rows[3]["l2"].startswith("shm: shm:///dev/shm/cachepipe-bench-") and rows[3]["samples"] == 8
    store = rows[3]["l2"].split("shm://", 1)[1].split(",")[0]  # this run's own store: other tests make theirs
    assert store.startswith("/dev/shm/cachepipe-bench-") and not Path(store).exists()  # the store made for the run is gone
    assert main(["bench", "cache", str(source), "--cache-dir", str(cache_dir), "--also-l2", "shm://x"]) == 2
