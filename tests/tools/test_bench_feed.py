"""``cachepipe bench feed``: the CPU proxy's rows and its bad-flag errors."""
from __future__ import annotations

import json

from tools.bench.feed import BUDGETS
from tools.cli import main as cli_main
from tools.bench.harness.output import read_rows

FIELDS = ("output", "main_thread_ms_per_image", "other_threads_ms_per_image", "worker_ms_per_image",
          "redis_ms_per_image", "faults_per_batch", "l1_reads", "source_reads", "images_per_s")


def test_feed_writes_a_row_per_output_with_every_stage(source, cache_dir, tmp_path, capsys):
    out = tmp_path / "feed.json"
    assert cli_main(["bench", "feed", str(source), "--cache-dir", str(cache_dir), "--batch-size", "4", "--size", "32",
                     "--cache-size", "40", "--batches", "3", "--rounds", "1", "--step-ms", "1",
                     "--also-l2", "shm://", "--shm-memory", "64mb", "--json", str(out)]) == 0
    rows = read_rows(out)
    assert [(r["output"], r["l2"].split(":")[0]) for r in rows] == [("uint8", "embedded"), ("float32", "embedded"),
                                                                   ("uint8", "shm"), ("float32", "shm")]
    assert [r["redis_servers"] for r in rows] == [1, 1, 0, 0] and rows[2]["redis_ms_per_image"] == 0  # no server
    for row in rows:
        assert all(f in row for f in FIELDS)
        assert row["l1_reads"] == 0 and row["source_reads"] == 0  # warmed first: all from L2
        assert row["images_per_s"] > 0 and row["worker_ms_per_image"] >= 0  # clock ticks: 0 in so short a run
        assert set(row["verdict"]) == set(BUDGETS) | {"worker_ms_per_image"}
    assert "budgets:" in capsys.readouterr().out


def test_feed_rejects_a_negative_step_and_unknown_outputs(source, cache_dir, capsys):
    assert cli_main(["bench", "feed", str(source), "--cache-dir", str(cache_dir), "--step-ms", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--step-ms must be >= 0" in err[0]
    assert cli_main(["bench", "feed", str(source), "--cache-dir", str(cache_dir), "--outputs", "int4"]) == 2
    assert "--outputs 'int4'" in capsys.readouterr().err
    # a batch larger than the set: one line in flags, before the warm-up (it spoke of drop_last=False)
    assert cli_main(["bench", "feed", str(source), "--cache-dir", str(cache_dir), "--no-l2", "--batch-size",
                     "100000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--batch-size 100000: SRC has" in err[0] and "drop_last" not in err[0]
