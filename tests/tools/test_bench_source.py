"""``cachepipe bench source`` (NOTE [bench source]): its four checks on tiny trees. Rows and
counts only: the timings are the benchmark's (docs/benchmarks/source.md), never asserted here."""
from __future__ import annotations

import pytest

from tools.bench.harness.output import read_rows
from tools.cli import main as cli_main


@pytest.mark.fuse
def test_bench_source_checks_every_file_read_once_and_no_l1_growth(tmp_path):
    out = tmp_path / "source.json"
    assert cli_main(["bench", "source", "--dir", str(tmp_path / "work"), "--scan-files", "300", "--warm-files", "40",
                     "--file-kb", "8", "--node-files", "60", "--json", str(out)]) == 0
    rows = {r["check"]: r for r in read_rows(out)}
    assert rows["scan seconds"]["files"] == 300 and rows["scan seconds"]["metadata_calls"] >= 300
    assert rows["warm-up MB/s (L1)"]["l1_entries"] == 40
    nodes = rows["two nodes: opens per file"]
    assert nodes["met"] and nodes["opens"] == 60 and sum(nodes["l1"]) == 60 and nodes["only_partition"]
    chmod = rows["chmod -R: opens per file"]
    assert chmod["met"] and chmod["reused"] == 60 and chmod["l1_written"] == 0


def test_bench_source_refuses_an_unknown_check_in_one_line(tmp_path, capsys):
    assert cli_main(["bench", "source", "--dir", str(tmp_path), "--checks", "scan,nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--checks" in err[0] and "nope" in err[0]
