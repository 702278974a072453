"""Issue 32, item 7: the ranks of ``cachepipe train --nprocs N`` end with their launcher.

A real job of 2 gloo ranks; its launcher gets a real SIGTERM (it stops the ranks, waits
for them and exits 143 with one line) or a real SIGKILL (the ranks get SIGTERM from the
kernel, ``PR_SET_PDEATHSIG``, and stop). Either way no rank trains on, no checkpoint is
written after the stop and no ``/dev/shm`` segment of a rank is left. Only processes this
test started are signalled: the job, and in the clean-up any of its ranks still alive
(proven by pid and start time).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from comm.shm_names import SHM_DIR
from tests.faults.train_faults import train_dataset  # noqa: F401
from tools.bench.faults import spawned_children


def _start_time(pid: int) -> int | None:
    try:
        stat = open(f"/proc/{pid}/stat", "rb").read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    return None if fields[0] == b"Z" else int(fields[19])  # a zombie has ended


def _alive(ranks: dict[int, int]) -> list[int]:
    return [pid for pid, start in ranks.items() if _start_time(pid) == start]


def _job(data, out, log):
    argv = [sys.executable, "-m", "tools", "train", "--data", str(data), "--recipe", "demo", "--loader", "memory",
            "--epochs", "200", "--batch-size", "4", "--size", "32", "--set", "train.eval_size=32",
            "--set", "schedule.warmup_epochs=0", "--device", "cpu", "--nprocs", "2", "--nodes", "1",
            "--threads", "1", "--ckpt-every", "2", "--out", str(out)]
    with open(log, "w") as f:  # a file: orphaned ranks would hold a pipe open
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=f)


def _generations(out):
    return sorted(p.name for p in (out / "checkpoints").glob("gen*.npz"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_the_ranks_end_with_their_launcher(train_dataset, tmp_path, sig):
    out, log = tmp_path / "run", tmp_path / "stderr.log"
    job = _job(train_dataset, out, log)
    ranks: dict[int, int] = {}
    try:
        while not (out / "checkpoints" / "gen2.npz").exists():  # training, a few checkpoints in
            assert job.poll() is None, log.read_text()[-2000:]
            time.sleep(0.02)
        ranks = {pid: _start_time(pid) for pid in spawned_children(job.pid)}
        assert len(ranks) == 2
        os.kill(job.pid, sig)  # our own job
        job.wait(timeout=60)
        err = log.read_text()
        deadline = time.monotonic() + 20
        while _alive(ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(ranks), f"ranks {_alive(ranks)} outlived their launcher"
        if sig == signal.SIGTERM:
            assert job.returncode == 128 + signal.SIGTERM and err.count("\n") == 1, err[-2000:]
            assert "stopped by SIGTERM" in err and f"--resume {out}" in err
        written = _generations(out)
        time.sleep(1.0)
        assert _generations(out) == written  # nothing trains on
        assert not [n for n in os.listdir(SHM_DIR) if any(f".p{pid}.t" in n for pid in ranks)]
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        for pid in _alive(ranks):  # orphans of our own job (a failing run on an old build)
            os.kill(pid, signal.SIGKILL)
