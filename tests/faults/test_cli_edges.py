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
import sys
from pathlib import Path

import pytest

from tests.faults.cache_faults import needs_root, tmpfs

ROOT = Path(__file__).resolve().parents[2]


def _cli(cwd, *argv, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "tools", *map(str, argv)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


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
    _one_line(_cli(here, *argv), 2, f"{flag} is empty")
    assert not os.listdir(here)
