"""Issue 32, items 9, 12 and 17: what ``cachepipe train`` says when a run stops or cannot start.

Real processes: a password-protected ``redis-server`` (the "to resume" line must not print
the password), a run whose loss becomes NaN (dense and sparse stop alike, exit 1, one
line), read-only ``--out`` / ``--cache-dir`` on a real read-only tmpfs (one line, no
traceback).
"""
from __future__ import annotations

import subprocess

import pytest

from tests.forked import run_tools
from tests.faults.cache_faults import needs_root, tmpfs
from tests.faults.train_faults import train_dataset  # noqa: F401

SECRET = "pw-of-the-l2"


def _train(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_tools("train", *args, timeout=timeout)


def _common(data, loader="memory"):
    return ["--data", data, "--recipe", "demo", "--loader", loader, "--batch-size", 8, "--size", 32,
            "--set", "train.eval_size=32", "--set", "train.cache_size=36", "--set", "schedule.warmup_epochs=0",
            "--set", "train.workers=1", "--device", "cpu", "--epochs", 1]


def test_the_resume_line_masks_the_redis_password(train_dataset, tmp_path, redis_server):
    redis_server.client().config_set("requirepass", SECRET)
    url = f"redis://:{SECRET}@127.0.0.1:{redis_server.port}/0"
    r = _train(*_common(train_dataset, "torch"), "--cache-dir", tmp_path / "cache", "--redis", url,
               "--out", tmp_path / "run", "--stop-after-steps", 2)
    assert r.returncode == 0, r.stderr[-2000:]
    assert SECRET not in r.stdout + r.stderr
    line = next(l for l in r.stdout.splitlines() if "to resume:" in l)
    assert f"redis://:***@127.0.0.1:{redis_server.port}/0" in line and "password is shown as ***" in line


@pytest.mark.parametrize("comm, nprocs", [("dense", 1), ("hitopk", 2)])
def test_a_diverged_run_stops_with_one_line_dense_or_sparse(train_dataset, tmp_path, comm, nprocs):
    r = _train(*_common(train_dataset), "--epochs", 3, "--comm", comm, "--lr", 1e8, "--nprocs", nprocs,
               "--threads", 1, "--out", tmp_path / "run")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr[-2000:]
    assert " at epoch 0, global step " in r.stderr and "the run diverged; lower the learning rate" in r.stderr
    assert "top-k" not in r.stderr


@needs_root()
def test_a_read_only_out_or_cache_dir_is_one_line(train_dataset, tmp_path):
    with tmpfs(tmp_path / "ro", readonly=True) as ro:
        r = _train(*_common(train_dataset), "--out", ro / "run")
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-2000:]
        assert f"--out {ro}/run: cannot write there" in r.stderr and "read-only file system" in r.stderr
        r = _train(*_common(train_dataset, "torch"), "--cache-dir", ro / "cache", "--out", tmp_path / "run")
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-2000:]
        assert f"--cache-dir {ro}/cache: cannot write there" in r.stderr
    assert not (tmp_path / "run").exists()
