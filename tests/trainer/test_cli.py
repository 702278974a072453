"""`cachepipe train` / `cachepipe report` as users run them, and failure handling."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.forked import run_tools
from trainer.checkpoint import Checkpoints
from trainer.launch import WorkerFailed, launch_local


def _cli(*args, timeout=240):
    return run_tools(*args, timeout=timeout)


def test_demo_with_a_tiny_setting_trains_logs_and_reports(tmp_path):
    demo = tmp_path / "demo"
    # the README's main command, in a new interpreter as a user starts it
    argv = ["train", "--demo", "--demo-dir", demo, "--demo-classes", 4, "--demo-per-class", 16,
            "--demo-val-per-class", 4, "--epochs", 2, "--batch-size", 8]
    res = subprocess.run([sys.executable, "-m", "tools", *map(str, argv)], capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "2 nodes x 2" in res.stdout and "top1" in res.stdout and "demo: final top-1" in res.stdout
    rows = [json.loads(line) for line in (demo / "run/metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [0, 1]
    for key in ("train_loss", "val_top1", "val_top5", "images_per_s", "seconds", "time_per_iter"):
        assert key in rows[0]
    assert 0 <= rows[-1]["val_top1"] <= rows[-1]["val_top5"] <= 100
    assert rows[-1]["val_images"] == 16
    # 64 images / 4 ranks / batch 8 = 2 steps of 32 images per epoch, all read from warmed L2
    assert rows[0]["cache"] == {"l2_hits": 64, "l1_hits": 0, "source_reads": 0}
    # 4 steps in all, under the warm-up's floor: the density warms up from end to end (NOTE [warm-ups in steps])
    from trainer.schedules import density_at

    assert rows[-1]["comm"] == "hitopk" and rows[-1]["density"] == (density_at(2, density=0.01, warmup_steps=4)
                                                                    + density_at(3, density=0.01, warmup_steps=4)) / 2
    assert not list((demo / "cache").glob("redis/redis.pid"))  # the demo stopped its Redis
    rep = _cli("report", demo / "run", tmp_path / "other_name_for_same_run", "--out", tmp_path / "rep")
    assert rep.returncode == 2 and "other_name_for_same_run does not exist" in rep.stderr
    rep = _cli("report", demo / "run", "--out", tmp_path / "rep")
    assert rep.returncode == 0, rep.stderr
    for name in ("accuracy.png", "loss.png", "breakdown.png", "summary.md"):
        assert (tmp_path / "rep" / name).stat().st_size > 0
    assert "| demo/run (demo, 4 workers, hitopk) | 2 |" in (tmp_path / "rep/summary.md").read_text()


@pytest.mark.parametrize("args, match", [
    (["--data", "{tmp}/nowhere"], "data root .* does not exist"),
    (["--data", "{tmp}"], r"lacks train/<class>/<image>"),
    (["--data", "{data}", "--nprocs", "3", "--nodes", "2"], r"2 nodes x 1 workers = 2 ranks, but the world size is 3"),
    (["--data", "{data}", "--recipe", "demo", "--comm", "ring"], r"comm 'ring' is unknown"),
    (["--epochs", "1"], r"--data ROOT is required"),
    (["--data", "{data}", "--recipe", "demo", "--density", "2"], r"--density 2: must be in \(0, 1\]$"),
    (["--data", "{data}", "--nprocs", "0"], r"--nprocs 0: must be >= 1$"),
    (["--data", "{data}", "--recipe", "demo", "--exchange-fraction", "1.5"],
     r"exchange_fraction \(--exchange-fraction\) must be in \[0, 1\]; got 1.5"),
    (["--data", "{data}", "--recipe", "demo", "--pipeline-exchange", "--amp", "fp16"],
     r"pipeline_exchange \(--pipeline-exchange\) needs train.amp bf16 or off"),
    (["--data", "{data}", "--recipe", "demo", "--pipeline-exchange", "--comm", "powersgd"],
     r"phases\[0\] exchange inside DDP's backward \(powersgd\)"),
    (["--data", "{data}", "--recipe", "demo", "--pipeline-exchange", "--ddp"], r"--ddp .* drop one of them$"),
    (["--data", "{data}", "--recipe", "demo", "--comm", "auto", "--ddp"], r"--comm auto .* drop one of them$"),
    # 48 training images / 4 ranks / batch 4 = 3 steps an epoch, 8 epochs = 24 (NOTE [warm-ups in steps])
    (["--data", "{data}", "--recipe", "demo", "--nprocs", "4", "--batch-size", "4", "--set",
      "phases.0.density_warmup_steps=25"], r"^cachepipe train: error: phases\[0\].density_warmup_steps 25 is longer "
                                           r"than the run it warms up \(24 steps\)"),
    (["--data", "{data}", "--recipe", "demo", "--set", "schedule.warmup_steps=-1"],
     r"schedule.warmup_steps must be >= 0; got -1"),
    (["--data", "{data}", "--recipe", "demo", "--set", "phases.0.density_warmup_epochs=9"],
     r"phases\[0\]: phase density_warmup_epochs must be in \[0, 8\]"),
    (["--data", "{data}", "--recipe", "demo", "--seed", "-1"], r"^cachepipe train: error: --seed -1: must be in "
                                                               r"\[0, 2\*\*32 - 1\]"),
    (["--data", "{data}", "--recipe", "demo", "--set", "train.seed=4294967296"],
     r"train.seed \(--seed\) must be in \[0, 2\*\*32 - 1\]; got 4294967296$"),
    # 48 training images: no full batch of 100000 (training drops a partial batch); said in flags
    (["--data", "{data}", "--recipe", "demo", "--batch-size", "100000"],
     r"batch size 100000 per rank \(--batch-size, phases\[0\].batch_size\): the 48 training images over 1 "
     r"rank\(s\) give no full batch \(training drops a partial one\); lower it to at most 48$"),
    (["--data", "{data}", "--recipe", "demo", "--batch-size", "13", "--nprocs", "4"],
     r"the 48 training images over 4 rank\(s\) give no full batch .*; lower it to at most 12$"),
])
def test_bad_input_is_a_one_line_error(tmp_path, small_dataset, args, match, capsys):
    # in this process: ``python -m tools`` is ``sys.exit(main())``, and a subprocess per case
    # only added an interpreter and torch import (~1.5 s of CPU each); the subprocess tests
    # below and in tests/faults/test_cli_edges.py check what a real process prints
    from tools.cli import main

    try:
        code = main(["train", *[a.format(tmp=tmp_path, data=small_dataset) for a in args], "--out",
                     str(tmp_path / "o")])
    except SystemExit as exc:  # argparse's own errors, as in the process
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and re.search(match, lines[0]), err
    assert not (tmp_path / "o").exists()  # refused before the run started


def test_a_run_that_fails_is_a_one_line_error_with_exit_1(tmp_path, small_dataset):
    # the flags are fine (batch 8: the 48 images give 24 per rank); the ranks find the problem (embedded
    # Redis with node locality)
    res = _cli("train", "--data", small_dataset, "--recipe", "demo", "--locality", "node", "--nprocs", "2",
               "--nodes", "2", "--batch-size", "8", "--cache-dir", tmp_path / "cache", "--set", "train.workers=0",
               "--out", tmp_path / "o")
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(r"rank \d failed: LocalityError: locality='node' cannot place samples on "
                                         r"2 nodes with the embedded Redis", lines[0]), res.stderr


def test_threads_default_to_omp_num_threads_else_the_cores_shared_by_the_workers(monkeypatch):
    from tools.train import _default_threads

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert (_default_threads(1), _default_threads(4)) == (3, 3)
    for unset in ("0", "two", ""):
        monkeypatch.setenv("OMP_NUM_THREADS", unset)
        assert (_default_threads(1), _default_threads(4), _default_threads(16)) == (8, 2, 1)
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert _default_threads(3) == 2


def test_checkpoint_from_another_model_is_refused(tmp_path):
    Checkpoints(tmp_path, 0).save({"model_name": "resnet18", "recipe": "demo", "step": 3}, {"x": 1})
    with pytest.raises(ValueError, match="model_name='resnet18' but this run has model_name='resnet50'"):
        Checkpoints(tmp_path, 0).load({"model_name": "resnet50", "recipe": "demo"})
    shared, local = Checkpoints(tmp_path, 0).load({"model_name": "resnet18"})
    assert shared["step"] == 3 and local == {"x": 1}


def _dies(rank, world):
    import torch.distributed as dist

    if rank == 1:
        os._exit(3)
    dist.barrier()  # would wait forever for rank 1


def _raises(rank, world):
    if rank == 1:
        raise ValueError("bad shard")
    time.sleep(60)


def test_a_dead_worker_fails_the_job_with_its_rank_and_reason():
    start = time.monotonic()
    with pytest.raises(WorkerFailed, match="rank 1 failed: exited with status 3"):
        launch_local(_dies, 2)
    with pytest.raises(WorkerFailed, match="rank 1 failed: ValueError: bad shard"):
        launch_local(_raises, 2)
    assert time.monotonic() - start < 50  # nobody waited for the sleeping/blocked ranks


def _umask_of_rank(rank, world):
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("Umask:")).split()[1], 8)


def test_ranks_take_the_launchers_umask_not_the_fork_servers():
    old = os.umask(0o022)
    try:
        assert launch_local(_umask_of_rank, 1) == 0o022  # the fork server runs from here on, umask 022
        os.umask(0o077)
        assert launch_local(_umask_of_rank, 2) == 0o077  # a job started with umask 077: private checkpoints
    finally:
        os.umask(old)


def _start_method_of_rank(rank, world):
    import multiprocessing

    return multiprocessing.get_context()._name


def test_ranks_start_their_workers_as_a_new_interpreter_would():
    """Issue 46, defect 10: a rank forked from the fork server took ``forkserver`` as its default
    start method, so its loader workers came from a fork server of its own that a killed rank
    left behind (with a worker and a resource tracker)."""
    import multiprocessing

    assert launch_local(_start_method_of_rank, 1) == multiprocessing.get_all_start_methods()[0]


def test_first_run_without_recipe_names_it_stops_where_asked_and_resumes(tmp_path, small_dataset):
    out = tmp_path / "by-hand" / "train"
    old = os.umask(0o027)
    try:
        res = _cli("train", "--data", small_dataset, "--device", "cpu", "--loader", "memory", "--epochs", 2,
                   "--batch-size", 8, "--out", out, "--stop-after-steps", 8)
    finally:
        os.umask(old)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    # the recipe and why come first, before any training
    assert lines[0].startswith("train: resnet_small (recipe demo), 2 epochs") and "no --recipe given" in lines[0]
    assert "validation" in lines[1] and "train" in lines[1] and "top1" in lines[2]
    assert "stopped at global step 8 (--stop-after-steps): epoch 1, batch 2 of 6" in res.stdout
    resume = next(line for line in lines if line.startswith("train: to resume: "))
    argv = __import__("shlex").split(resume.removeprefix("train: to resume: "))
    assert argv[:2] == ["cachepipe", "train"] and "--stop-after-steps" not in argv
    assert argv[-2:] == ["--resume", str(out)]
    assert (out / "metrics.jsonl").stat().st_mode & 0o777 == 0o640  # the umask's mode, not mkstemp's 0600
    assert {p.stat().st_mode & 0o777 for p in (out / "checkpoints").iterdir()} == {0o640}  # checkpoints too
    again = _cli(*argv[1:])
    assert again.returncode == 0, again.stderr[-2000:]
    assert "final top-1" in again.stdout and "after epoch 1" in again.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [0, 1] and all("val_loss" in r for r in rows)
    done = _cli(*argv[1:])  # nothing left: the run's table, under its header, and that nothing was trained
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "validation" in lines[1] and "top1" in lines[2] and lines[3].split()[0] == "0" and lines[4].split()[0] == "1"
    assert lines[5] == f"train: the run in {out} has trained all 2 epochs; nothing to resume (to train on: --epochs N " \
                       f"with --allow-changes)"
