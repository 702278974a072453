"""``cachepipe bench train --convergence``: variants, the runs built from the flags, errors, a tiny real run."""
from __future__ import annotations

import json
import re

import pytest

from tools.bench.parts.train_convergence import build_runs, parse_variant
from tools.cli import main as cli
from tools.bench.parts.train_convergence_runs import add_dense_reference
from trainer.recipes import load_recipe
from tools.bench.harness.output import read_rows


@pytest.mark.parametrize("text, want", [
    ("lowlr:optim.lr=0.1", ("lowlr", ["optim.lr=0.1"])),
    ("a-b:optim.lr=0.1, train.seed=3", ("a-b", ["optim.lr=0.1", "train.seed=3"])),
    ("m:schedule.milestones=[1, 2],optim.lr=0.2", ("m", ["schedule.milestones=[1, 2]", "optim.lr=0.2"])),
    ("p:phases.0.density=0.1", ("p", ["phases.0.density=0.1"])),
])
def test_parse_variant_splits_assignments_not_list_values(text, want):
    assert parse_variant(text) == want


@pytest.mark.parametrize("text", ["nolr", "x:", ":optim.lr=1", "bad name:optim.lr=1", "a/b:optim.lr=1"])
def test_parse_variant_rejects_malformed_text_naming_the_flag(text):
    with pytest.raises(ValueError, match="--variant"):
        parse_variant(text)


def test_build_runs_dense_once_variants_per_sparse_algorithm_sets_last():
    base = load_recipe("demo")
    runs = build_runs(base, ["dense", "hitopk", "gtopk"], density=0.02, epochs=3, sets=["optim.lr=0.3"],
                      variants=[("seed1", ["train.seed=1"]), ("lr", ["optim.lr=0.1"])])
    assert [r.name for r in runs] == ["dense", "hitopk", "gtopk", "hitopk-seed1", "gtopk-seed1",
                                      "hitopk-lr", "gtopk-lr"]
    by = {r.name: r.recipe for r in runs}
    assert [by[n].phases[0].comm for n in ("dense", "hitopk", "gtopk-lr")] == ["dense", "hitopk", "gtopk"]
    assert all(r.recipe.total_epochs == 3 and r.recipe.phases[0].density == 0.02 for r in runs)
    assert by["gtopk"].train.seed == 0 and by["gtopk-seed1"].train.seed == 1 and by["gtopk-seed1"].optim.lr == 0.3
    assert by["hitopk-lr"].optim.lr == 0.1  # a variant's own sets come after --set


def test_build_runs_rejects_variants_without_a_sparse_algorithm_and_bad_overrides():
    base = load_recipe("demo")
    with pytest.raises(ValueError, match="--variant applies to the sparse"):
        build_runs(base, ["dense"], density=0.01, epochs=None, sets=[], variants=[("v", ["optim.lr=0.1"])])
    with pytest.raises(ValueError, match=r"--variant v: --set 'optim.nope=1': unknown field 'nope'"):
        build_runs(base, ["hitopk"], density=0.01, epochs=None, sets=[], variants=[("v", ["optim.nope=1"])])


def _row(name, top1, inter_node_bytes):
    return {"name": name, "final_top1": top1, "inter_node_bytes": inter_node_bytes}


def test_dense_reference_deltas_and_byte_ratios():
    rows = [_row("hitopk", 60.0, 30), _row("dense", 65.5, 1000), _row("gtopk", 70.0, None)]
    add_dense_reference(rows)
    assert [r["delta_top1_vs_dense"] for r in rows] == [-5.5, 0.0, 4.5]
    assert [r.get("bytes_vs_dense") for r in rows] == [0.03, 1.0, None]  # gtopk's bytes were not recorded
    alone = [_row("hitopk", 60.0, 30)]
    add_dense_reference(alone)
    assert alone == [_row("hitopk", 60.0, 30)]


@pytest.mark.parametrize("argv, match", [
    (["--data", "{tmp}/missing"], r"--data .*/missing: no train/ or val/ folder"),
    (["--comm", "dense,ring"], r"--comm 'dense,ring': unknown \['ring'\]"),
    (["--set", "optim.lr"], r"--set 'optim.lr': expected section.field=value"),
    (["--set", "optim.lr=-1"], r"--set: recipe demo: .*optim.lr must be > 0"),
    (["--recipe", "nosuch"], r"unknown recipe 'nosuch'"),
    (["--variant", "novalue"], r"--variant 'novalue': expected NAME:"),
    (["--density", "0"], r"--density 0: must be in \(0, 1\]"),
    (["--epochs", "0"], r"--epochs 0: must be >= 1"),
    (["--batch-size", "8"], r"--batch-size is not a --convergence flag; .* --set phases.0.batch_size=N"),
])
def test_cli_bad_input_is_one_line_naming_the_flag(argv, match, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code = cli(["bench", "train", "--convergence", str(tmp_path / "conv"), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert re.search(match, err), err
    assert not (tmp_path / "conv" / "data").exists()  # nothing was generated or trained


def test_cli_tiny_real_run_with_a_variant(tmp_path, capsys):
    """One short epoch on 4 real gloo processes per run: hitopk, and hitopk with a variant's
    overrides; rows and per-epoch curves in the JSON, one run directory each."""
    from tools.demo_dataset import make_dataset

    data = make_dataset(tmp_path / "data", classes=2, per_class=8, val_per_class=2, size=20, seed=0)
    out, rows_json = tmp_path / "conv", tmp_path / "rows.json"
    sets = ["phases.0.batch_size=2", "phases.0.size=16", "train.cache_size=20", "train.eval_size=16",
            "schedule.warmup_epochs=0", "schedule.decay=constant", "phases.0.density_warmup_epochs=0"]
    code = cli(["bench", "train", "--convergence", str(out), "--data", str(data), "--comm", "hitopk",
                "--epochs", "1", *(a for s in sets for a in ("--set", s)),
                "--variant", "lowlr:optim.lr=0.05,optim.scale_lr=false", "--json", str(rows_json)])
    assert code == 0
    rows = read_rows(rows_json)
    assert [r["name"] for r in rows] == ["hitopk", "hitopk-lowlr"]
    assert [r["density"] for r in rows] == [0.01, 0.01]
    for r in rows:
        assert r["epochs"] == 1 and len(r["top1"]) == 1 and r["best_top1"] == r["final_top1"] == r["top1"][0]
        assert r["seconds"] > 0 and r["final_loss"] > 0 and r["inter_node_bytes"] > 0  # summed from the metrics
    assert "delta_top1_vs_dense" not in rows[0]  # no dense run to compare with
    lrs = {r["name"]: json.loads((out / r["name"] / "metrics.jsonl").read_text().splitlines()[-1])["lr"] for r in rows}
    assert lrs["hitopk-lowlr"] == pytest.approx(0.05) and lrs["hitopk"] != lrs["hitopk-lowlr"]
    assert (out / "report").is_dir()
    assert "hitopk-lowlr" in capsys.readouterr().out
