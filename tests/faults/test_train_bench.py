"""``cachepipe bench faults`` (tools/bench/faults.py): only its argument check here; the
scenarios it runs are each covered by a test of their own in tests/faults/ (a full run
takes minutes; docs/benchmarks/faults.md has its table)."""
from __future__ import annotations

import os
import subprocess
import sys


def test_too_few_epochs_is_a_one_line_error():
    res = subprocess.run([sys.executable, "-m", "tools", "bench", "faults", "--epochs", "1"], capture_output=True,
                         text=True, timeout=60, cwd=os.getcwd())
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "--epochs must be >= 2" in res.stderr


def test_processes_a_run_leaves_behind_are_found_by_their_mark_and_killed():
    from tools.bench.faults import _MARK, _kill_marked

    left = subprocess.Popen(["sleep", "60"], env={**os.environ, _MARK: "test-run"})  # as a rank that outlived its job
    other = subprocess.Popen(["sleep", "60"], env={**os.environ, _MARK: "another-run"})
    try:
        assert _kill_marked("test-run", grace=0.5) == [left.pid]  # it outlives any grace
        assert left.wait(timeout=10) < 0 and other.poll() is None  # only the marked one
    finally:
        other.kill()
        other.wait()
