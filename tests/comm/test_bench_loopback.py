"""``cachepipe bench comm --loopback`` (the path taken without root): rows and plot."""
from __future__ import annotations

from tools.bench.harness.output import read_rows
from tools.cli import main


def test_bench_comm_on_loopback_writes_rows_and_plot(tmp_path, capsys):
    rc = main(["bench", "comm", "--loopback", "--emulate", "2x1", "--sizes", "5000", "20000", "--reps", "1",
               "--warmup", "0", "--algorithms", "2dtar", "gtopk", "--json", str(tmp_path / "rows.json"),
               "--plot", str(tmp_path / "fig.png")])
    assert rc == 0
    rows = read_rows(tmp_path / "rows.json")
    assert [(r["algorithm"], r["numel"]) for r in rows] == [("2dtar", 5000), ("gtopk", 5000),
                                                            ("2dtar", 20000), ("gtopk", 20000)]
    assert all(r["inter_mbit"] is None and r["median_s"] > 0 and r["predicted_s"] >= 0 for r in rows)
    assert all(r["intra_transport"] == "gloo" for r in rows)  # one worker per node: nothing to share
    assert (tmp_path / "fig.png").stat().st_size > 0
    assert "2x1 on loopback" in capsys.readouterr().out
