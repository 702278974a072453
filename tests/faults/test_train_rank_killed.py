"""Issue 17: a rank SIGKILLed in a real multi-process run; ``--resume`` finishes the run with
the same result as an uninterrupted one (CPU), and nothing is left in /dev/shm."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from comm.shm_names import SHM_DIR
from tests.forked import run_tools
from tests.faults.train_faults import train_dataset  # noqa: F401
from tools.bench.faults import spawned_children

KEYS = ("epoch", "steps", "train_loss", "val_loss", "val_top1", "val_top5", "skipped")


def _rows(out):
    return [{k: json.loads(line)[k] for k in KEYS} for line in (out / "metrics.jsonl").read_text().splitlines()]


def _train(*args):
    return [sys.executable, "-m", "tools", "train", *map(str, args)]


def test_a_killed_rank_resumes_to_the_uninterrupted_result(train_dataset, tmp_path):
    common = ["--data", train_dataset, "--recipe", "demo", "--loader", "memory", "--epochs", 6, "--batch-size", 4,
              "--size", 32, "--set", "train.eval_size=32", "--set", "schedule.warmup_epochs=1", "--device", "cpu",
              "--nprocs", 2, "--nodes", 1, "--ckpt-every", 3, "--threads", 1]
    straight = run_tools("train", *common, "--out", tmp_path / "straight", timeout=300)
    assert straight.returncode == 0, straight.stderr[-2000:]
    out = tmp_path / "broken"
    job = subprocess.Popen(_train(*common, "--out", out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not (out / "checkpoints/gen3.npz").exists():  # a few checkpoints in, well before the end
            assert job.poll() is None, job.communicate()[1][-2000:]
            time.sleep(0.02)
        victim = spawned_children(job.pid)[-1]  # a rank of our own job
        os.kill(victim, signal.SIGKILL)
        _, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 1 and "killed by signal SIGKILL" in err, err[-2000:]
    assert len(_rows(out)) < 6
    assert not [n for n in os.listdir(SHM_DIR) if f".p{victim}.t" in n]
    resumed = run_tools("train", *common, "--resume", out, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert _rows(out) == _rows(tmp_path / "straight")  # bit-identical on CPU
