"""Exit status 2 and one line naming the flag for bad flags, in every command."""
from __future__ import annotations

import json
import os

import pytest

from tools.cli import main


def test_bare_bench_lists_the_benchmarks_like_help(capsys):
    assert main(["bench"]) == 2
    out = capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["bench", "--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out == out and "loader " in out and "omgs " in out


@pytest.mark.parametrize("argv, message", [
    (["train"], "--data ROOT is required"),
    (["train", "--demo", "--density", "2"], r"--density 2: must be in (0, 1]"),
    (["train", "--demo", "--epochs", "0"], "--epochs 0: must be >= 1"),
    (["train", "--demo", "--recipe", "nope"], "unknown recipe 'nope'"),
    (["train", "--demo", "--set", "optim.nope=1"], "unknown field 'nope'"),
])
def test_train_bad_flags_exit_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cachepipe train: error: ") and message in err[0]


def test_bench_loader_unknown_loader_exits_2(tmp_path, capsys):
    assert main(["bench", "loader", str(tmp_path), "--cache-dir", str(tmp_path / "c"), "--loaders", "plain,x"]) == 2
    assert "--loaders: unknown ['x']" in capsys.readouterr().err


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_bench_json_gets_the_umask_mode(tmp_path, umask):
    from tools.bench.harness.output import write_document

    old = os.umask(umask)
    try:
        write_document(tmp_path / "rows.json", {"rows": [{"a": 1}]})
    finally:
        os.umask(old)
    assert (tmp_path / "rows.json").stat().st_mode & 0o777 == 0o666 & ~umask
    assert json.loads((tmp_path / "rows.json").read_text()) == {"rows": [{"a": 1}]}


def test_bench_loader_missing_tcp_server_exits_2(source, tmp_path, capsys):
    argv = ["bench", "loader", str(source), "--cache-dir", str(tmp_path / "c"), "--loaders", "cached-tcp",
            "--tcp-server", str(tmp_path / "no-redis-server")]
    assert main(argv) == 2
    assert "--tcp-server" in capsys.readouterr().err

