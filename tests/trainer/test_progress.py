"""What rank 0 prints (table, progress bar, configuration / final / resume lines) and the report's plots."""
from __future__ import annotations

import argparse
import io
import os
import shlex

import pytest

from tools.resume import resume_command
from trainer.metrics import MetricsLog
from trainer.progress import describe_run, epoch_bar, final_line, format_row, print_row
from trainer.recipes import load_recipe, override

ROW = {"epoch": 3, "size": 56, "comm": "hitopk", "train_loss": 1.25, "images_per_s": 812.0, "val_loss": 19.5,
       "val_top1": 41.0, "val_top5": 88.5, "time_per_iter": {"data": 0.001, "compute": 0.02},
       "cache": {"l2_hits": 64, "l1_hits": 0, "source_reads": 0}}


def test_table_says_train_and_validation_and_shows_validation_loss(capsys):
    print_row(ROW, header=True)
    groups, header, line = capsys.readouterr().out.splitlines()
    # each number sits under the group its column belongs to
    train, val = groups.index("train"), groups.index("validation")
    assert groups.index("|") < val < groups.index("|", val) and train < groups.index("|")
    assert header.count("loss") == 2 and line == format_row(ROW)
    cut = header.index("|")
    assert "1.250" in line[:cut] and "19.500" in line[cut:header.index("|", cut + 1)]


def test_configuration_final_and_resume_lines():
    line = describe_run(load_recipe("dawnbench28"), workers="8 workers", loader="torch", why="because")
    assert line.startswith("resnet50 (recipe dawnbench28), 28 epochs at 96 > 128 > 224 > 288 px")
    assert "comm auto (density 0.01, mstopk), loader" in line and line.endswith("loader torch (because)")
    paper = override(load_recipe("dawnbench28"), sets=["phases.0.comm=hitopk", "phases.1.comm=2dtar"])
    assert "hitopk (density 0.01, mstopk) > 2dtar > auto (density" in describe_run(paper, workers="8", loader="torch")
    assert final_line([ROW], 12.0, "runs/x").startswith("final top-1 41.0%, top-5 88.5%, validation loss 19.500 "
                                                        "after epoch 3 in 12 s; metrics in runs/x/metrics.jsonl")
    args = argparse.Namespace(command_line=["cachepipe", "train", "--data", "d x", "--stop-after-steps", "5",
                                            "--resume=old", "--epochs", "2"], data="d x")
    assert shlex.split(resume_command(args, "runs/y")) == ["cachepipe", "train", "--data", "d x", "--epochs", "2",
                                                           "--resume", "runs/y"]


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_only_on_a_terminal(monkeypatch):
    monkeypatch.setattr("sys.stderr", io.StringIO())
    bar = epoch_bar(2, 10, 3)
    bar.step(0.5)
    bar.close()
    assert __import__("sys").stderr.getvalue() == ""  # a log file gets the table rows only
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    bar = epoch_bar(2, 10, 3)
    bar.step(0.5)
    bar.close()
    assert "epoch 2" in term.getvalue() and "3/10" in term.getvalue()  # resumed epochs start at done
    quiet = _Terminal()
    monkeypatch.setattr("sys.stderr", quiet)
    epoch_bar(2, 10, show=False).close()  # other ranks
    assert quiet.getvalue() == ""


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_metrics_file_gets_the_umask_mode(tmp_path, umask):
    old = os.umask(umask)
    try:
        log = MetricsLog(tmp_path / "run" / "metrics.jsonl")
        log.append({"epoch": 0})
    finally:
        os.umask(old)
    assert (tmp_path / "run" / "metrics.jsonl").stat().st_mode & 0o777 == 0o666 & ~umask


def _rows(n, comm="dense", recipe="demo", world=4):
    return [{"epoch": e, "comm": comm, "recipe": recipe, "world_size": world, "size": 56, "phase": 0,
             "steps": 10 * (e + 1), "val_top1": 10.0 * e, "val_top5": 20.0 * e, "train_loss": 2.0 - e,
             "val_loss": 2.5 - e, "time_per_iter": {"data": 0.01, "compute": 0.1, "compress": 0.0,
                                                    "communicate": 0.02, "update": 0.01}} for e in range(n)]


def test_report_numbers_epochs_as_the_console_and_names_runs_apart():
    from trainer.report import curve, run_labels

    rows = _rows(3)
    assert curve(rows, "val_top1") == [(0, 0.0), (1, 10.0), (2, 20.0)]  # epochs from 0, as metrics.jsonl
    labels = run_labels(["/x/a/runs/train", "/x/b/runs/train", "/x/c/train"],
                        [_rows(1), _rows(1, comm="hitopk", world=1), _rows(1, recipe="dawnbench28")])
    assert labels == ["a/runs/train (demo, 4 workers, dense)", "b/runs/train (demo, 1 worker, hitopk)",
                      "c/train (dawnbench28, 4 workers, dense)"]
    assert run_labels(["runs/train"], [[{"epoch": 0}]]) == ["runs/train"]


def test_breakdown_legend_does_not_cover_the_bars():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trainer.report import breakdown_figure

    fig = breakdown_figure({"a/train": _rows(2), "b/train": _rows(2, comm="hitopk")})
    fig.canvas.draw()
    ax = fig.axes[0]
    legend, plot = ax.get_legend().get_window_extent(), ax.get_window_extent()
    bars = [p.get_window_extent() for p in ax.patches]
    assert bars and not any(legend.overlaps(b) for b in bars) and legend.x0 >= plot.x1
    plt.close(fig)


def test_report_files_get_the_umask_mode(tmp_path):
    import json

    from trainer.report import write_report

    run = tmp_path / "runs" / "train"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(2)))
    old = os.umask(0o027)
    try:
        paths = write_report([run], tmp_path / "report")
    finally:
        os.umask(old)
    assert len(paths) == 4 and all(p.stat().st_mode & 0o777 == 0o640 for p in paths)


def test_report_shows_residual_norms_and_inter_node_bytes(tmp_path):
    import json

    from trainer.report import write_report

    runs = []
    for name, norms, sent in (("dense", [0.0, 0.0], 3_000_000), ("hitopk", [2.0, 40.0], 40_000)):
        run = tmp_path / name
        run.mkdir()
        rows = [dict(r, residual_norm=n, inter_node_bytes=sent) for r, n in zip(_rows(2, comm=name), norms)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs.append(run)
    paths = write_report(runs, tmp_path / "report")
    assert (tmp_path / "report/residual.png") in paths
    summary = (tmp_path / "report/summary.md").read_text()
    assert "| 6.00 | 0 |" in summary and "| 0.08 | 40 |" in summary  # MB over both epochs, final norm
