"""``cachepipe bench train --emulate``: parsing, rows and target from recorded metrics, the CLI."""
from __future__ import annotations

import argparse
import json
import os
import re

import pytest

from tools.bench.parts.train_tta import breakdown, build_rows, time_to_target
from tools.bench.parts.train_emulated import run_kinds
from tools.cli import main as cli
from tools.bench.harness.cluster import netns_unavailable_reason
from tools.bench.harness.output import read_rows

REASON = netns_unavailable_reason()


def _epoch(epoch, top1, seconds, steps, compute=0.03, compress=0.0, communicate=0.3, data=0.01):
    return {"epoch": epoch, "val_top1": top1, "seconds": seconds, "steps": steps,
            "time_per_iter": {"data": data, "compute": compute, "compress": compress, "communicate": communicate,
                              "update": 0.001}}


DENSE = [_epoch(0, 50.0, 10.0, 20), _epoch(1, 65.0, 10.0, 40), _epoch(2, 70.0, 10.0, 60)]
HITOPK = [_epoch(0, 40.0, 3.0, 20, compress=0.002, communicate=0.05),
          _epoch(1, 69.5, 3.0, 40, compress=0.002, communicate=0.05),
          _epoch(2, 71.0, 3.0, 60, compress=0.004, communicate=0.07)]
GTOPK = [_epoch(0, 30.0, 4.0, 20), _epoch(1, 60.0, 4.0, 40)]


def test_time_to_target_is_the_end_of_the_first_epoch_that_reaches_it():
    assert time_to_target(DENSE, 69.0) == 30.0
    assert time_to_target(HITOPK, 69.0) == 6.0
    assert time_to_target(HITOPK, 40.0) == 3.0
    assert time_to_target(GTOPK, 69.0) is None


def test_rows_default_target_is_dense_final_minus_one_point():
    runs = {"dense": {"metrics": DENSE, "inter_node_bytes": 6_000_000, "job_s": 50.0},
            "hitopk": {"metrics": HITOPK, "inter_node_bytes": 600_000, "job_s": 20.0},
            "gtopk": {"metrics": GTOPK, "inter_node_bytes": 400_000, "job_s": 15.0}}
    rows = build_rows(runs)
    assert [r["comm"] for r in rows] == ["dense", "hitopk", "gtopk"]
    dense, hitopk, gtopk = rows
    assert {r["target_top1"] for r in rows} == {69.0}
    assert (dense["seconds_to_target"], hitopk["seconds_to_target"], gtopk["seconds_to_target"]) == (30.0, 6.0, None)
    assert hitopk["speedup_to_target_vs_dense"] == pytest.approx(5.0)
    assert "speedup_to_target_vs_dense" not in gtopk
    assert (dense["final_top1"], hitopk["final_top1"], hitopk["best_top1"]) == (70.0, 71.0, 71.0)
    assert (dense["seconds"], dense["steps"], dense["step_s"]) == (30.0, 60, 0.5)
    assert dense["inter_node_bytes_per_step"] == 100_000 and gtopk["inter_node_bytes_per_step"] == 10_000
    json.dumps(rows)  # --json writes them as they are (None -> null)


def test_rows_with_an_explicit_target_need_no_dense_run():
    rows = build_rows({"hitopk": {"metrics": HITOPK, "inter_node_bytes": 0, "job_s": 1.0}}, target_top1=45.0)
    assert rows[0]["target_top1"] == 45.0 and rows[0]["seconds_to_target"] == 6.0
    with pytest.raises(ValueError, match="include dense in --comm .*or pass --target-top1"):
        build_rows({"hitopk": {"metrics": HITOPK, "inter_node_bytes": 0, "job_s": 1.0}})
    with pytest.raises(ValueError, match="gtopk run has no finished epoch"):
        build_rows({"gtopk": {"metrics": [], "inter_node_bytes": 0, "job_s": 1.0}}, target_top1=1.0)


def test_node_local_runs_are_rows_of_their_algorithm_measured_against_the_first_dense_run():
    runs = {"dense": {"metrics": DENSE, "inter_node_bytes": 6_000_000, "job_s": 50.0},
            "dense-node": {"metrics": HITOPK, "inter_node_bytes": 5_000_000, "job_s": 40.0, "comm": "dense",
                           "locality": "node"},
            "hitopk-node": {"metrics": HITOPK, "inter_node_bytes": 500_000, "job_s": 20.0, "comm": "hitopk",
                            "locality": "node"}}
    rows = build_rows(runs)
    assert [(r["comm"], r["locality"]) for r in rows] == [("dense", "global"), ("dense", "node"), ("hitopk", "node")]
    assert {r["target_top1"] for r in rows} == {69.0}  # the first (global) dense run's, not dense-node's 71 - 1
    assert rows[2]["speedup_to_target_vs_dense"] == pytest.approx(5.0)
    # with node-local sampling only (the --emulate default), dense-node sets the target
    rows = build_rows({name: runs[name] for name in ("dense-node", "hitopk-node")})
    assert {r["target_top1"] for r in rows} == {70.0}
    assert rows[1]["speedup_to_target_vs_dense"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="include dense in --comm"):
        build_rows({"hitopk-node": runs["hitopk-node"]})


def test_pipelined_runs_are_rows_of_their_algorithm_and_named_after_it():
    runs = {"dense": {"metrics": DENSE, "inter_node_bytes": 6_000_000, "job_s": 50.0},
            "dense-pipe": {"metrics": HITOPK, "inter_node_bytes": 6_000_000, "job_s": 40.0, "comm": "dense",
                           "pipeline": True}}
    rows = build_rows(runs)
    assert [(r["comm"], r["pipeline"]) for r in rows] == [("dense", False), ("dense", True)]
    assert {r["target_top1"] for r in rows} == {69.0}  # the dense run without pipelining sets it
    with pytest.raises(ValueError, match="off in --pipeline-exchange"):
        build_rows({"dense-pipe": runs["dense-pipe"]})
    # every --comm with every choice, except powersgd (inside DDP's backward) pipelined
    assert run_kinds(["dense", "powersgd"], "global,node", "off,on") == {
        "dense": ("dense", "global", False), "dense-pipe": ("dense", "global", True),
        "dense-node": ("dense", "node", False), "dense-node-pipe": ("dense", "node", True),
        "powersgd": ("powersgd", "global", False), "powersgd-node": ("powersgd", "node", False)}


def test_breakdown_weights_epochs_by_their_steps_and_derives_waiting():
    b = breakdown(HITOPK)
    # (2 * 2 ms + 4 ms) / 3 epochs of 20 steps each
    assert b["selection_ms"] == pytest.approx((2 + 2 + 4) / 3)
    assert b["exchange_ms"] == pytest.approx((50 + 50 + 70) / 3)
    assert b["waiting_ms"] == pytest.approx(b["selection_ms"] + b["exchange_ms"])
    assert b["compute_ms"] == pytest.approx(30.0) and b["data_ms"] == pytest.approx(10.0)
    # an engine that records its own exchange duration (overlapped with backward) is used as is
    overlapped = [dict(DENSE[0], time_per_iter=dict(DENSE[0]["time_per_iter"], exchange=0.5))]
    assert breakdown(overlapped)["exchange_ms"] == pytest.approx(500.0)
    assert breakdown(overlapped)["waiting_ms"] == pytest.approx(300.0)


def _record(out, name, metrics, inter_node_bytes, **kind):
    (out / name).mkdir(parents=True)
    (out / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    (out / name / "bench.json").write_text(json.dumps({"inter_node_bytes": inter_node_bytes, "job_s": 9.0, **kind}))


def test_cli_reuse_combines_recorded_runs_into_json_and_plot(tmp_path, capsys):
    out = tmp_path / "bench"
    _record(out, "dense", DENSE, 6_000_000)
    _record(out, "hitopk", HITOPK, 600_000)
    _record(out, "hitopk-node", GTOPK, 500_000, comm="hitopk", locality="node")
    code = cli(["bench", "train", "--emulate", "2x2@10", "--comm", "dense,hitopk", "--locality", "global,node",
                "--out", str(out), "--reuse", "--json", str(tmp_path / "rows.json")])
    assert code == 2
    assert "dense-node holds no finished run" in capsys.readouterr().err
    code = cli(["bench", "train", "--emulate", "2x2@10", "--comm", "dense,hitopk", "--locality", "global", "--out",
                str(out), "--reuse", "--json", str(tmp_path / "rows.json")])
    assert code == 0, capsys.readouterr().err
    rows = read_rows((tmp_path / "rows.json"))
    assert [(r["comm"], r["seconds_to_target"]) for r in rows] == [("dense", 30.0), ("hitopk", 6.0)]
    for key in ("comm", "final_top1", "target_top1", "seconds_to_target", "seconds", "step_s",
                "inter_node_bytes_per_step"):
        assert all(key in r for r in rows)
    assert (out / "top1_vs_time.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| hitopk" in capsys.readouterr().out


def test_generated_data_is_kept_per_size_and_count(tmp_path):
    from PIL import Image

    from tools.bench.parts.train_emulated import _prepare_data

    def prepare(size, per_class):
        return _prepare_data(argparse.Namespace(data=None, per_class=per_class, resolved={"cache_size": size}), tmp_path)

    small, large, more = prepare(20, 1), prepare(40, 1), prepare(20, 2)
    assert len({small, large, more}) == 3 and prepare(20, 1) == small
    assert len(list((more / "train").rglob("*.JPEG"))) == 2 * len(list((small / "train").rglob("*.JPEG")))
    side = [min(Image.open(next((d / "train").rglob("*.JPEG"))).size) for d in (small, large)]
    assert side[0] < side[1]
    assert _prepare_data(argparse.Namespace(data=str(tmp_path / "mine")), tmp_path) == tmp_path / "mine"


def test_each_exchange_trains_its_own_epochs_where_comm_epochs_says(tmp_path):
    """NOTE [epochs per exchange]: --comm-epochs gives the named runs their own epochs."""
    from tools.bench.parts.train_emulated import _train_argv, parse_comm_epochs

    assert parse_comm_epochs(" hitopk=10, auto=12 ", ["dense", "hitopk", "auto"]) == {"hitopk": 10, "auto": 12}
    assert parse_comm_epochs("", ["dense"]) == {}
    args = argparse.Namespace(resolved={"epochs": 8, "size": 32, "batch_size": 32, "cache_size": 32},
                              comm_epochs={"hitopk": 10}, recipe="cifar10", powersgd_rank=2, model=None,
                              density=None, set=[])
    epochs = {comm: _train_argv(args, comm, "node", False, tmp_path, tmp_path / comm, tmp_path, ["redis://h:1/0"])
              for comm in ("dense", "hitopk")}
    assert {comm: argv[argv.index("--epochs") + 1] for comm, argv in epochs.items()} == {"dense": "8", "hitopk": "10"}


def test_real_photos_train_at_their_own_size_within_the_step_budget(tmp_path):
    """NOTE [emulate on real photos]: 32 px photos train at 32 px, batch 32, for at most 8 epochs
    and STEP_BUDGET steps; flags win; larger photos keep the recorded default."""
    from PIL import Image

    from tools.bench.parts.train_emulated import STEP_BUDGET, settings

    def resolved(data, **flags):
        args = dict(data=str(data) if data else None, size=None, cache_size=None, batch_size=None, epochs=None)
        return settings(argparse.Namespace(**{**args, **flags}), 4)

    def photos(name, width, height, count=1):
        (tmp_path / name / "train/cat").mkdir(parents=True)
        Image.new("RGB", (width, height), (90, 60, 30)).save(tmp_path / name / "train/cat/0.jpg")
        for i in range(1, count):  # the same photo under other names: counted, never decoded here
            os.link(tmp_path / name / "train/cat/0.jpg", tmp_path / name / f"train/cat/{i}.jpg")
        return tmp_path / name

    small, large = photos("small", 32, 40), photos("large", 160, 128)
    many = photos("many", 32, 32, count=4 * STEP_BUDGET // 3)  # batch 1: 3 epochs of STEP_BUDGET / 3 steps
    (tmp_path / "empty/train").mkdir(parents=True)
    assert resolved(small) == {"size": 32, "cache_size": 32, "batch_size": 32, "epochs": 8}
    assert resolved(large) == {"size": 96, "cache_size": 96, "batch_size": 32, "epochs": 8}
    assert resolved(None) == {"size": 96, "cache_size": 96, "batch_size": 32, "epochs": 8}
    assert resolved(many, batch_size=1)["epochs"] == 3 and resolved(many, batch_size=1, epochs=5)["epochs"] == 5
    assert resolved(many)["epochs"] == 8  # batch 32: 12 steps an epoch
    assert resolved(small, batch_size=64, epochs=2, size=24) == {"size": 24, "cache_size": 24, "batch_size": 64,
                                                                 "epochs": 2}
    with pytest.raises(ValueError, match="--data .*empty: no readable photo under train/"):
        resolved(tmp_path / "empty")


@pytest.mark.parametrize("argv, match", [
    (["--emulate", "2x2@fast"], "--emulate '2x2@fast': expected MxN\\[@MBIT\\]"),
    (["--emulate", "2x2", "--comm", "dense,ring"], r"--comm 'dense,ring': unknown \['ring'\]; valid: \['dense'"),
    (["--emulate", "2x2", "--comm", "dense", "--powersgd-rank", "0"], "--powersgd-rank must be >= 1"),
    (["--emulate", "2x2", "--per-class", "0"], "--per-class must be >= 1"),
    (["--emulate", "2x2", "--comm", "dense,omgs", "--reuse"], "--reuse: .* holds no finished run"),
    (["--emulate", "2x2", "--locality", "global,rack"], r"--locality 'global,rack': unknown \['rack'\]; valid: \['global'"),
    (["--emulate", "2x2", "--pipeline-exchange", "yes"],
     r"--pipeline-exchange 'yes': unknown \['yes'\]; valid: \['off', 'on'\]"),
    # refused before any training: without the dense reference run there is no default target
    (["--emulate", "2x2", "--comm", "dense,hitopk", "--pipeline-exchange", "on"],
     r"default target is the dense run's final top-1 .* or pass --target-top1"),
    (["--emulate", "2x2", "--comm", "hitopk", "--locality", "node"], "include dense in --comm"),
    (["--emulate", "2x2", "--burst", "1"], "--burst 1: the tbf bucket must hold one packet"),
    (["--emulate", "2x2", "--comm", "dense,hitopk", "--comm-epochs", "gtopk=10"],
     r"--comm-epochs 'gtopk=10': 'gtopk' is not in --comm \['dense', 'hitopk'\]"),
    (["--emulate", "2x2", "--comm-epochs", "hitopk=0"], "--comm-epochs 'hitopk=0': expected COMM=N with N >= 1"),
    (["--emulate", "2x2", "--comm", "dense,hitopk", "--comm-epochs", "hitopk=3,hitopk=4"],
     r"--comm-epochs 'hitopk=3,hitopk=4': 'hitopk' is given twice"),
])
def test_cli_bad_input_is_one_line_naming_the_flag(argv, match, tmp_path, capsys):
    code = cli(["bench", "train", *argv, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert re.search(match, err), err


@pytest.mark.netns
@pytest.mark.skipif(REASON is not None, reason=str(REASON))
def test_emulated_cluster_end_to_end_tiny(tmp_path, monkeypatch):
    """Two emulated nodes of one process, one short epoch per algorithm, locality and pipelining: the
    harness runs real ``cachepipe train`` ranks, counts link bytes and cleans up its namespaces."""
    import subprocess

    from tools.bench.harness.cluster import EmulatedCluster

    made, init = [], EmulatedCluster.__init__  # this run's clusters (another run may have its own)
    monkeypatch.setattr(EmulatedCluster, "__init__", lambda self, *a, **k: (init(self, *a, **k), made.append(self))[0])
    out = tmp_path / "bench"
    code = cli(["bench", "train", "--emulate", "2x1@100", "--comm", "dense,powersgd", "--locality", "global,node",
                "--pipeline-exchange", "off,on", "--epochs", "1",
                "--per-class", "8", "--batch-size", "8", "--size", "16", "--cache-size", "20", "--out", str(out),
                "--json", str(tmp_path / "rows.json"), "--set", "schedule.warmup_epochs=0"])
    assert code == 0
    rows = read_rows((tmp_path / "rows.json"))
    assert [(r["comm"], r["locality"], r["pipeline"]) for r in rows] == [
        ("dense", "global", False), ("dense", "global", True), ("dense", "node", False), ("dense", "node", True),
        ("powersgd", "global", False), ("powersgd", "node", False)]
    for r in rows:
        assert r["steps"] == 5 and r["inter_node_bytes_per_step"] > 0 and r["seconds"] > 0
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    assert made and not [ns for c in made for ns in [*c.namespaces, c.switch] if ns in netns]
