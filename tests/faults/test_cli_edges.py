"""Issue 32, items 12 and 17: bad input and unwritable paths are one line, never a traceback.

Real commands in real processes, run from an empty working directory so that anything
they create there shows: empty flag values, a ``server stop`` on a file or a missing
directory, ``--json`` and ``report --out`` on a real read-only tmpfs (checked before the
work), a metrics row without ``val_top1``, an image size past the bound, a set too small
for ``bench loader``'s batch.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.forked import run_tools
from tests.faults.cache_faults import needs_root, tmpfs

ROOT = Path(__file__).resolve().parents[2]


def _cli(cwd, *argv, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_tools(*argv, cwd=cwd, timeout=timeout)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:].split()[0] != b"Z"  # a zombie has ended


def _one_line(r, code: int, *words: str) -> None:
    assert r.returncode == code and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    for word in words:
        assert word in r.stderr, r.stderr


@pytest.mark.parametrize("argv, flag", [
    (["make-dataset", ""], "DIR"),
    (["warmup", "SRC", "--cache-dir", ""], "--cache-dir"),
    (["stats", "SRC", "--cache-dir", ""], "--cache-dir"),
    (["train", "--data", "DATA", "--cache-dir", ""], "--cache-dir"),
    (["train", "--data", "DATA", "--out", ""], "--out"),
    (["server", "stop", "--cache-dir", ""], "--cache-dir"),
    (["bench", "loader", "SRC", "--cache-dir", ""], "--cache-dir"),
])
def test_an_empty_path_is_refused_not_taken_as_the_current_directory(tiny_dataset, tmp_path, argv, flag):
    here = tmp_path / "cwd"
    here.mkdir()
    argv = [{"SRC": tiny_dataset / "train", "DATA": tiny_dataset}.get(a, a) for a in argv]
    _one_line(_cli(here, *argv), 2, f"{flag} '': empty")
    assert not os.listdir(here)


def test_server_stop_on_a_file_or_a_missing_dir_creates_nothing(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a cache dir")
    for action in ("stop", "status", "start"):
        r = _cli(tmp_path, "server", action, "--cache-dir", a_file)
        _one_line(r, 2, f"--cache-dir {a_file} is not a directory")
    missing = tmp_path / "missing" / "cache"
    r = _cli(tmp_path, "server", "stop", "--cache-dir", missing)
    assert r.returncode == 1 and "no embedded Redis was running" in r.stdout and not r.stderr
    assert not (tmp_path / "missing").exists()


@needs_root()
def test_server_stop_on_a_read_only_file_system(tmp_path):
    with tmpfs(tmp_path / "fs", size="8m") as fs:
        r = _cli(tmp_path, "server", "start", "--cache-dir", fs / "cache", "--l2-memory", "16mb")
        assert r.returncode == 0, r.stderr
        pid = int(r.stdout.split("pid ")[1].split(",")[0])
        subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
        r = _cli(tmp_path, "server", "stop", "--cache-dir", fs / "cache")
        assert r.returncode == 0 and "stopped" in r.stdout and "Traceback" not in r.stderr, r.stderr
        assert not _running(pid)
        r = _cli(tmp_path, "server", "stop", "--cache-dir", fs / "cache")
        assert r.returncode == 1 and not r.stderr, r.stderr
        r = _cli(tmp_path, "server", "stop", "--cache-dir", fs / "never-made")
        assert r.returncode == 1 and not r.stderr, r.stderr


@needs_root()
def test_output_paths_on_a_read_only_file_system_are_refused_before_the_work(tiny_dataset, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"epoch": 0, "train_loss": 1.0, "val_top1": 50.0}) + "\n")
    with tmpfs(tmp_path / "ro", readonly=True) as ro:
        cache = tmp_path / "cache"
        src = tiny_dataset / "train"
        for argv, flag in ((["warmup", src, "--cache-dir", cache, "--json", ro / "w.json"], "--json"),
                           (["bench", "cache", src, "--cache-dir", cache, "--json", ro / "b.json"], "--json"),
                           (["doctor", "--json", ro / "d.json"], "--json"),
                           (["report", run, "--out", ro / "report"], "--out")):
            _one_line(_cli(tmp_path, *argv), 2, f"{flag} {ro}/", "read-only file system")
        assert not cache.exists()  # refused before any work


def test_an_output_that_fails_after_the_check_is_one_line(tmp_path):
    from tools.bench.harness.output import write_document
    from tools.cli import UsageError

    (tmp_path / "in-the-way").write_text("a file where a folder should be")
    with pytest.raises(UsageError, match=r"--json .*/rows\.json: cannot write it \(File exists: .*in-the-way\)"):
        write_document(tmp_path / "in-the-way" / "rows.json", {"rows": [{"a": 1}]})


def test_report_reads_rows_without_val_top1_and_names_a_bad_row(tmp_path):
    run = tmp_path / "runs" / "old"
    run.mkdir(parents=True)
    rows = [{"epoch": 0, "train_loss": 1.5, "steps": 3}, {"epoch": 1, "train_loss": 1.0, "val_top1": 40.0, "steps": 6}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:1]))
    r = _cli(tmp_path, "report", run)
    assert r.returncode == 0, r.stderr
    assert "| 1 | - | - | - | 1.5000 |" in r.stdout
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = _cli(tmp_path, "report", run)
    assert r.returncode == 0 and "| 2 | 40.00 | - | 40.00 | 1.0000 |" in r.stdout, r.stderr
    (run / "metrics.jsonl").write_text('{"epoch": 0}\n[1, 2]\n')
    _one_line(_cli(tmp_path, "report", run), 2, "metrics.jsonl:2 is not a metrics row")


def test_make_dataset_refuses_an_image_size_past_its_bound(tmp_path):
    r = _cli(tmp_path, "make-dataset", tmp_path / "d", "--size", 100000)
    _one_line(r, 2, "--size 100000: must be in [16, 2048]")
    assert not (tmp_path / "d").exists()


def test_bench_loader_on_a_set_smaller_than_a_batch_is_one_line(tiny_dataset, tmp_path):
    _one_line(_cli(tmp_path, "bench", "loader", tiny_dataset / "train", "--cache-dir", tmp_path / "cache"), 2,
              "--batch-size 64: SRC has 24 images")
    assert not (tmp_path / "cache").exists()  # refused before any cache or worker started
