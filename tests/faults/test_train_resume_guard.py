"""Issue 32, items 1 and 14: a resume never replaces another run and never changes the topology.

Real ``cachepipe train`` processes on real run directories: run A resumed into run B's
``--out`` (refused, B untouched; replaced with ``--overwrite``), and a run of 2 nodes x 1
resumed as 1 node x 2 (refused in one line naming both shapes).
"""
from __future__ import annotations

import json
import shutil
import subprocess

from tests.forked import run_tools
from tests.faults.train_faults import train_dataset  # noqa: F401
from trainer.checkpoint import Checkpoints


def _train(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_tools("train", *args, timeout=timeout)


def _common(data):
    return ["--data", data, "--recipe", "demo", "--loader", "memory", "--batch-size", 8, "--size", 32,
            "--set", "train.eval_size=32", "--set", "schedule.warmup_epochs=0", "--device", "cpu", "--epochs", 2]


def _snapshot(run):
    return {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def test_resume_into_another_runs_out_is_refused_unless_overwrite(train_dataset, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    stopped = _train(*_common(train_dataset), "--out", a, "--stop-after-steps", 3)
    assert stopped.returncode == 0, stopped.stderr[-2000:]
    shutil.copytree(a, b)  # another run's directory (its own copy, to be continued by itself)
    (b / "metrics.jsonl").write_text('{"epoch": 0, "note": "run B"}\n')
    before_a, before_b = _snapshot(a), _snapshot(b)
    refused = _train(*_common(train_dataset), "--resume", a, "--out", b)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr[-2000:]
    assert f"--out {b} holds another run" in refused.stderr and "--overwrite" in refused.stderr
    assert _snapshot(b) == before_b and _snapshot(a) == before_a  # neither run was touched
    replaced = _train(*_common(train_dataset), "--resume", a / "checkpoints", "--out", b, "--overwrite")
    assert replaced.returncode == 0, replaced.stderr[-2000:]
    assert [json.loads(r)["epoch"] for r in (b / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    assert Checkpoints(b, 0).generations() == [3, 2]  # A's generation 1 continued in B
    assert _snapshot(a) == before_a


def test_resume_with_another_topology_is_refused_in_one_line(train_dataset, tmp_path):
    out = tmp_path / "run"
    common = [*_common(train_dataset), "--batch-size", 4, "--nprocs", 2, "--threads", 1]
    stopped = _train(*common, "--nodes", 2, "--local-size", 1, "--out", out, "--stop-after-steps", 2)
    assert stopped.returncode == 0, stopped.stderr[-2000:]
    moved = _train(*common, "--nodes", 1, "--local-size", 2, "--resume", out)
    assert moved.returncode == 1 and moved.stderr.count("\n") == 1, moved.stderr[-2000:]
    assert "2 nodes x 1" in moved.stderr and "1 node x 2" in moved.stderr and "--nodes 2 --local-size 1" in moved.stderr
    assert "ResidualMemory" not in moved.stderr
