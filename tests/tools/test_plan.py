"""``cachepipe plan``: its rows, its inputs (presets, bench JSON in both forms) and its bad flags."""
from __future__ import annotations

import json

import pytest

from comm.cost_model import LinkParams, predict
from comm.registry import ALGORITHMS
from tools.cli import main

REQUIRED = {"algorithm", "images_per_s", "scaling_efficiency", "step_s", "compute_s", "exchange_s",
            "exposed_exchange_s"}
PRICED = [n for n, a in ALGORITHMS.items() if a.cost is not None]


def _plan(tmp_path, *argv):
    out = tmp_path / "plan.json"
    assert main(["plan", *map(str, argv), "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_one_row_per_algorithm_that_adds_up(tmp_path):
    rows = _plan(tmp_path, "--preset", "mlsys21", "--model", "resnet50", "--size", "96", "--batch-size", "256")
    assert [r["algorithm"] for r in rows] == PRICED
    for r in rows:
        assert REQUIRED <= set(r)
        assert r["step_s"] == pytest.approx(r["compute_s"] + r["exposed_exchange_s"] + r["update_s"] + r["overhead_s"])
        assert r["images_per_s"] == pytest.approx(128 * 256 / r["step_s"])
        assert r["epoch_s"] == pytest.approx(1_281_167 // 128 // 256 * r["step_s"])
        assert 0 < r["scaling_efficiency"] < 1 and r["params"] == 25_557_032
    by = {r["algorithm"]: r for r in rows}
    assert by["hitopk"]["images_per_s"] > by["2dtar"]["images_per_s"] > by["dense"]["images_per_s"]


def test_flags_override_the_preset(tmp_path):
    base = _plan(tmp_path, "--preset", "mlsys21", "--model", "resnet50", "--batch-size", "256")
    fast = _plan(tmp_path, "--preset", "mlsys21", "--model", "resnet50", "--batch-size", "256", "--nodes", "2",
                 "--inter-gbit", "100", "--set", "overhead_ms=0")
    assert fast[0]["nodes"] == 2 and fast[0]["link"]["beta_inter"] == pytest.approx(8 / 100e9)
    assert all(f["overhead_s"] == 0 and f["scaling_efficiency"] > b["scaling_efficiency"] for f, b in zip(fast, base))


def test_the_dawnbench28_choice_on_the_seeds_testbed_is_the_papers(tmp_path):
    rows = _plan(tmp_path, "--preset", "mlsys21", "--recipe", "dawnbench28")
    auto = rows[-1]
    assert auto["algorithm"] == "auto" and [r["algorithm"] for r in rows[:-1]] == PRICED
    choices = [(p["size"], p["comm"]) for p in auto["phases"]]
    assert choices[0] == (96, "hitopk")
    assert all(comm in ("2dtar", "dense") for _, comm in choices[1:]) and [s for s, _ in choices] == [96, 128, 224, 288]
    assert auto["run_steps"] == 507 + 429 + 117 + 78
    assert auto["run_s"] <= min(r["run_s"] for r in rows[:-1])
    assert {d["cache_size"] for d in auto["data"]} == {128, 320}


def _bench_comm_rows(link: LinkParams) -> list[dict]:
    """Rows as `cachepipe bench comm --json` writes them, timed by the cost model itself."""
    return [{"algorithm": a, "numel": n, "density": 0.01 if ALGORITHMS[a].sparse else None, "nodes": 2,
             "local_size": 2, "value_dtype": "fp32", "median_s": predict(a, n, 0.01 if ALGORITHMS[a].sparse else None,
                                                                          2, 2, link)}
            for a in ("dense", "hier", "2dtar", "topk_ag", "gtopk", "hitopk") for n in (78_042, 1_000_000, 25_557_032)]


@pytest.mark.parametrize("wrap", [lambda rows: rows, lambda rows: {"benchmark": "comm", "command": "x", "rows": rows}])
def test_links_fitted_from_bench_comm_json_in_both_forms(tmp_path, wrap):
    link = LinkParams(alpha_intra=1e-3, beta_intra=1e-10, alpha_inter=2e-3, beta_inter=4e-8, gamma=5e-8)
    path = tmp_path / "comm.json"
    path.write_text(json.dumps(wrap(_bench_comm_rows(link))))
    rows = _plan(tmp_path, "--nodes", "2", "--local-size", "2", "--links", path, "--params", "25557032",
                 "--gpu-images-per-s", "100", "--batch-size", "32", "--density", "0.01", "--files", "1000")
    for r in rows:
        density = 0.01 if ALGORITHMS[r["algorithm"]].sparse else None
        assert r["selection_s"] + r["exchange_s"] == pytest.approx(
            predict(r["algorithm"], 25_557_032, density, 2, 2, link), rel=1e-3)


@pytest.mark.parametrize("wrap", [lambda rows: rows, lambda rows: {"benchmark": "train", "rows": rows}])
def test_a_measured_profile_replaces_the_rate(tmp_path, wrap):
    path = tmp_path / "train.json"
    path.write_text(json.dumps(wrap([{"comm": "dense", "compute_ms": 150.0, "data_ms": 30.0, "pipeline": False},
                                     {"comm": "hitopk", "compute_ms": 250.0, "data_ms": 10.0, "pipeline": False},
                                     {"comm": "hitopk", "compute_ms": 999.0, "data_ms": 10.0, "pipeline": True}])))
    rows = _plan(tmp_path, "--nodes", "2", "--local-size", "2", "--inter-gbit", "0.004", "--intra-gbit", "10",
                 "--model", "resnet_small", "--classes", "10", "--batch-size", "32", "--profile", path,
                 "--files", "4000")
    by = {r["algorithm"]: r for r in rows}
    assert by["hitopk"]["compute_s"] == pytest.approx(0.25) and by["gtopk"]["compute_s"] == pytest.approx(0.15)
    assert all(r["overhead_s"] == pytest.approx(0.02) for r in rows)  # the median data wait
    throughput = tmp_path / "throughput.json"
    throughput.write_text(json.dumps(wrap([{"source": "torch", "images_per_s": 80.0},
                                           {"source": "synthetic", "images_per_s": 100.0}])))
    rows = _plan(tmp_path, "--nodes", "1", "--local-size", "1", "--inter-gbit", "1", "--intra-gbit", "10",
                 "--model", "resnet_small", "--batch-size", "32", "--profile", throughput, "--files", "100")
    assert rows[0]["compute_s"] == pytest.approx(0.32)


def test_plot_and_validate(tmp_path, capsys):
    png = tmp_path / "se.png"
    assert main(["plan", "--preset", "icdcs19", "--model", "resnet50", "--batch-size", "256", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert main(["plan", "--validate"]) == 0
    out = capsys.readouterr().out
    assert "| Table 3 | ResNet-50 (96*96) | MSTopK-SGD | 396,800 |" in out and "Table IV" in out


@pytest.mark.parametrize("argv, message", [
    (["--preset", "aws", "--model", "resnet50", "--batch-size", "8"], "--preset aws: unknown testbed"),
    (["--preset", "mlsys21", "--model", "vgg99", "--batch-size", "8"], "--model vgg99: unknown model"),
    (["--preset", "mlsys21", "--model", "resnet50", "--batch-size", "8", "--gpu-images-per-s", "0"],
     "--gpu-images-per-s 0: must be > 0"),
    (["--preset", "mlsys21", "--model", "resnet50", "--batch-size", "8", "--inter-gbit", "-1"], "--inter-gbit -1"),
    (["--preset", "mlsys21", "--model", "resnet50", "--batch-size", "8", "--density", "1.5"],
     "--density 1.5: must be in (0, 1]"),
    (["--preset", "mlsys21", "--model", "resnet50", "--global-batch-size", "1000"],
     "--global-batch-size 1000: does not divide over 128 GPUs"),
    (["--preset", "mlsys21", "--recipe", "nope"], "--recipe nope: unknown recipe 'nope'"),
    (["--nodes", "2", "--local-size", "2", "--model", "resnet50", "--batch-size", "8"], "--inter-gbit is required"),
    (["--preset", "mlsys21", "--model", "resnet18", "--batch-size", "8"], "--gpu-images-per-s is required"),
    (["--preset", "mlsys21", "--model", "resnet50", "--batch-size", "8", "--set", "speed=1"], "--set speed=1"),
])
def test_bad_input_is_one_line_naming_the_flag(argv, message, capsys):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cachepipe plan: error: ") and message in err[0], err


def test_unreadable_bench_json_names_its_flag(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"benchmark": "comm"}))
    assert main(["plan", "--nodes", "2", "--local-size", "2", "--links", str(bad), "--params", "100",
                 "--gpu-images-per-s", "1", "--batch-size", "1"]) == 2
    assert "--links" in capsys.readouterr().err
