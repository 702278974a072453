"""``cachepipe bench memory`` (issue 32, item 18): a real 2-process job per case, rows with
each case's peak RSS against torch's all-reduce hook; bad flags exit 2 in one line."""
from __future__ import annotations

import pytest

from tools.cli import main
from tools.bench.harness.output import read_rows


@pytest.mark.parametrize("argv, message", [
    (["--emulate", "1x1"], "at least 2 processes in all"),
    (["--emulate", "two"], "--emulate 'two': expected MxN[@MBIT]"),
    (["--densities", "0"], "--densities must be in (0, 1]"),
    (["--algorithms", "nope"], "invalid choice: 'nope'"),
])
def test_bad_flags_exit_2_with_one_line(argv, message, capsys):
    try:
        code = main(["bench", "memory", *argv])
    except SystemExit as exc:  # argparse's own checks
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and err[-1].startswith("cachepipe bench memory: error: ")


@pytest.mark.slow  # two 2-process jobs, each importing torch and comm: 15-40 s here
def test_a_tiny_model_gives_a_row_per_case_against_the_allreduce_hook(tmp_path, capsys):
    out = tmp_path / "memory.json"
    assert main(["bench", "memory", "--width", "64", "--layers", "2", "--steps", "2", "--algorithms", "topk_ag",
                 "--densities", "1.0", "--live-bytes", "--json", str(out)]) == 0
    rows = read_rows(out)
    assert [(r["hook"], r["density"], r["status"]) for r in rows] == [("allreduce", None, "ok"), ("topk_ag", 1.0, "ok")]
    for r in rows:
        assert r["peak_rss_mib"] >= r["start_rss_mib"] > 0 and len(r["rank_peak_rss_mib"]) == 2
        assert r["grad_mib"] == 0 and r["hook_peak_mib"] is not None  # 64 * 2 + 2 * 64 * 64 floats: under 1 MiB
    assert rows[0]["vs_allreduce"] == 1.0 and "| topk_ag" in capsys.readouterr().out
