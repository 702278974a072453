"""``cachepipe bench overlap``: plan specs, the rows from per-step times, bad flags, one tiny real run."""
from __future__ import annotations

import json

import pytest

from tools.bench.overlap import summarize
from tools.bench.ranks.overlap import plan_options
from tools.cli import main as cli
from tools.bench.harness.cluster import netns_unavailable_reason
from tools.bench.harness.output import read_rows

REASON = netns_unavailable_reason()


@pytest.mark.parametrize("spec, want", [("size", {"plan": "size"}),
                                        ("size:256", {"plan": "size", "bucket_bytes": 262144}),
                                        ("layer", {"plan": "layer"}), ("omgs", {"plan": "omgs"})])
def test_plan_options(spec, want):
    assert plan_options(spec) == want


@pytest.mark.parametrize("spec", ["size:0", "size:x", "layer:4", "omgs:paper", ""])
def test_plan_options_rejects_other_specs_naming_the_flag(spec):
    with pytest.raises(ValueError, match="^--plans "):
        plan_options(spec)


def _steps(*seconds, **extra):
    return [dict({"step": s, "cpu": s / 2}, **extra) for s in seconds]


def test_summarize_takes_medians_and_compares_overlap_with_the_larger_part():
    parts = {"backward": 0.02, "launch_in_backward": 0.004, "select_in_backward": 0.001, "sync": 0.01,
             "blocked": 0.006, "launch_in_sync": 0.0, "first_ready": 0.015}
    modes = {"compute": _steps(0.020, 0.030, 0.022), "exchange size": _steps(0.010, 0.012, 0.011),
             "no overlap size": _steps(0.033, 0.034, 0.035), "overlap size": _steps(0.025, 0.026, 0.0275, **parts),
             "pipeline size": _steps(0.023, 0.024, 0.022, **parts),
             "exchange layer": _steps(0.040, 0.041, 0.042), "no overlap layer": _steps(0.06, 0.07, 0.08),
             "overlap layer": _steps(0.05, 0.05, 0.05, **parts), "pipeline layer": _steps(0.04, 0.05, 0.04, **parts)}
    size, layer = summarize(modes, ["size", "layer"], {"size": 1, "layer": 29})
    assert size["plan"] == "size" and size["buckets"] == 1 and layer["buckets"] == 29
    assert size["compute_ms"] == pytest.approx(22.0) and size["exchange_ms"] == pytest.approx(11.0)
    assert size["max_ms"] == pytest.approx(22.0) and layer["max_ms"] == pytest.approx(41.0)
    assert size["no_overlap_ms"] == pytest.approx(34.0) and size["overlap_ms"] == pytest.approx(26.0)
    assert size["overlap_vs_max"] == pytest.approx(26.0 / 22.0)
    assert size["pipeline_ms"] == pytest.approx(23.0) and layer["pipeline_vs_max"] == pytest.approx(40.0 / 41.0)
    assert size["pipeline_cpu_ms"] == pytest.approx(11.5)
    assert size["blocked_ms"] == pytest.approx(6.0) and size["launch_in_backward_ms"] == pytest.approx(4.0)
    assert size["compute_cpu_ms"] == pytest.approx(11.0) and size["exchange_cpu_ms"] == pytest.approx(5.5)
    assert layer["overlap_cpu_ms"] == pytest.approx(25.0)
    # NOTE [overlap bound]: nothing leaves before the first bucket is ready
    assert size["bound_ms"] == pytest.approx(max(22.0, 15.0 + 11.0))
    assert layer["bound_ms"] == pytest.approx(15.0 + 41.0) and layer["overlap_vs_bound"] == pytest.approx(50.0 / 56.0)


@pytest.mark.parametrize("flags, match", [(["--emulate", "2by2"], "--emulate"), (["--plans", "size:-1"], "--plans"),
                                          (["--rounds", "0"], "--rounds must be >= 1"),
                                          (["--burst", "1"], "--burst 1: ")])
def test_bad_flags_exit_2_with_one_line(flags, match, capsys):
    assert cli(["bench", "overlap", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1


@pytest.mark.skipif(REASON is not None, reason=f"needs network namespaces: {REASON}")
def test_a_tiny_run_on_the_emulated_cluster_gives_one_row_per_plan(tmp_path):
    out = tmp_path / "rows.json"
    assert cli(["bench", "overlap", "--emulate", "2x2@100", "--plans", "size", "size:256", "omgs", "--rounds", "1",
                "--steps", "2", "--warmup", "0", "--size", "32", "--json", str(out)]) == 0
    rows = read_rows(out)
    assert [(r["plan"], r["buckets"]) for r in rows[:2]] == [("size", 1), ("size:256", 2)]
    assert rows[2]["plan"] == "omgs" and rows[2]["buckets"] >= 1
    for r in rows:
        assert r["overlap_ms"] > 0 and r["exchange_ms"] > 0 and r["backward_ms"] <= r["overlap_ms"] + 1e-9
        assert r["pipeline_ms"] > 0
        assert 0 < r["first_ready_ms"] <= r["backward_ms"] + 1e-9 and r["bound_ms"] >= r["compute_ms"]
