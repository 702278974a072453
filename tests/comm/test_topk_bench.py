"""``cachepipe bench topk`` end to end at toy sizes (no timing asserted)."""
from __future__ import annotations

import json

import pytest

from tools.cli import main as cli_main


def test_bench_topk_writes_rows_and_plot(tmp_path, capsys):
    out, png = tmp_path / "rows.json", tmp_path / "fig" / "topk.png"
    rc = cli_main(["bench", "topk", "--sizes", "4K,16K", "--density", "0.01,0.1", "--repeats", "1",
                   "--dist", "gaussian,sparse", "--json", str(out), "--plot", str(png)])
    assert rc == 0
    rows = json.loads(out.read_text())
    impls = {(r["selector"], r["impl"]) for r in rows}
    assert impls == {("exact", "torch"), ("dgc", "torch"), ("mstopk", "torch"), ("mstopk", "bisect")}
    assert len(rows) == 2 * 2 * 2 * 4  # dists x sizes x densities x impls (no GPU here)
    for r in rows:
        assert {"selector", "impl", "device", "numel", "k", "median_s", "recall", "energy"} <= set(r)
        assert r["device"] == "cpu" and r["median_s"] > 0
        assert r["k"] == int(r["density"] * r["numel"])
        assert r["recall"] >= 0.95 and r["energy"] >= 0.99
    assert png.stat().st_size > 10_000
    assert "| mstopk" in capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [
    (["--impls", "nope"], "unknown top-k selector"),
    (["--impls", "exact:gpu"], "only mstopk takes a kernel"),
    (["--dist", "uniform"], "unknown --dist"),
    (["--sizes", "12Q"], "--sizes: bad size '12Q'"),
])
def test_bench_topk_rejects_bad_arguments_with_exit_2(flags, message, capsys):
    assert cli_main(["bench", "topk", *flags]) == 2  # a bad flag, as everywhere
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cachepipe bench: error: ") and message in err[0]
