"""``cachepipe bench topk`` end to end at toy sizes (no timing asserted)."""
from __future__ import annotations

import json

import pytest

from comm.topk import k_for
from tools.cli import main as cli_main
from tools.bench.harness.output import read_rows


def test_bench_topk_writes_rows_and_plot(tmp_path, capsys):
    out, png = tmp_path / "rows.json", tmp_path / "fig" / "topk.png"
    rc = cli_main(["bench", "topk", "--sizes", "4K,16K", "--density", "0.01,0.1", "--repeats", "1",
                   "--dist", "gaussian,sparse", "--json", str(out), "--plot", str(png)])
    assert rc == 0
    rows = read_rows(out)
    impls = {(r["selector"], r["impl"]) for r in rows}
    assert impls == {("exact", "torch"), ("dgc", "torch"), ("mstopk", "torch"), ("mstopk", "bisect")}
    assert len(rows) == 2 * 2 * 2 * 4  # dists x sizes x densities x impls (no GPU here)
    for r in rows:
        assert {"selector", "impl", "device", "numel", "k", "median_s", "recall", "energy"} <= set(r)
        assert r["device"] == "cpu" and r["median_s"] > 0
        assert r["k"] == k_for(r["numel"], r["density"])  # the k the sparse exchanges keep
        assert r["recall"] >= 0.95 and r["energy"] >= 0.99
    assert png.stat().st_size > 10_000
    assert "| mstopk" in capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [
    (["--impls", "nope"], "unknown top-k selector"),
    (["--impls", "exact:gpu"], "only mstopk takes a kernel"),
    (["--dist", "uniform"], "unknown --dist"),
    (["--sizes", "12Q"], "--sizes: bad size '12Q'"),
    (["--density", "0.1,x"], "--density '0.1,x'"),
])
def test_bench_topk_rejects_bad_arguments_with_exit_2(flags, message, capsys):
    assert cli_main(["bench", "topk", *flags]) == 2  # a bad flag, as everywhere
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cachepipe bench topk: error: ") and message in err[0]


@pytest.mark.triton
def test_bench_topk_kernel_rows_report_candidates_passes_and_syncs(tmp_path):
    # In Triton's interpreter without a GPU (tests/conftest.py), as the command:
    # TRITON_INTERPRET=1 cachepipe bench topk --device cpu --kernel gpu --json PATH
    import torch

    out = tmp_path / "rows.json"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert cli_main(["bench", "topk", "--device", device, "--kernel", "gpu", "--sizes", "100K",
                     "--density", "0.001,0.01", "--json", str(out)]) == 0
    rows = read_rows(out)
    assert {(r["distribution"], r["impl"]) for r in rows} == {
        (d, i) for d in ("gaussian", "student_t3", "cauchy", "lognormal") for i in ("torch", "gpu")}
    for r in rows:
        assert {"distribution", "numel", "k", "candidates_per_k", "read_passes", "launches", "host_syncs"} <= set(r)
        assert r["candidates_per_k"] > 1 and r["recall"] >= 0.95
        if r["impl"] == "gpu":
            assert r["launches"] <= 6 and r["host_syncs"] <= 2
            # compiled kernels' loads cannot be counted (None); the interpreter's can
            assert r["read_passes"] is None if device == "cuda" else 1 < r["read_passes"] <= 2
            assert r["full_size_ops"] == 0
        else:
            assert 1 <= r["read_passes"] < 1.1  # one scan plus the sample


def test_bench_topk_kernel_gpu_without_a_gpu_or_interpreter_says_so(monkeypatch, capsys):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert cli_main(["bench", "topk", "--device", "cpu", "--kernel", "gpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--kernel gpu needs triton" in err[0]


def test_op_times_name_the_ops_a_call_spends_its_time_in():
    # On CUDA the same function reads the kernels' device time (bench topk's op_us).
    import torch

    from tools.bench.parts.topk_counts import op_times_us

    x = torch.randn(1 << 16)
    times = op_times_us(lambda: torch.topk(x.abs(), 100), 3, torch.device("cpu"))
    assert "aten::topk" in times and "aten::abs" in times and all(t > 0 for t in times.values())
    assert list(times.values()) == sorted(times.values(), reverse=True)
