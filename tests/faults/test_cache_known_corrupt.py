"""Issue 32, item 16: a warm-up with nothing changed writes nothing for known corrupt files,
and ``stats`` counts them apart instead of as samples missing from L2.

Real truncated JPEGs, a real redis-server, the real command line; "writes nothing" is
read from LMDB's own transaction counter.
"""
from __future__ import annotations

import json

import lmdb

from tests.cachepipe.conftest import truncate
from tools.cli import main as cli

SIZE = 32


def _last_txn(l1_path) -> int:
    with lmdb.open(str(l1_path), readonly=True, lock=False, max_dbs=2) as env:
        return env.info()["last_txnid"]


def test_known_corrupt_files_are_not_rewritten_and_are_counted_apart(source, tmp_path, redis_server, capsys):
    files = sorted(source.rglob("*.JPEG"))
    for f in (files[2], files[9]):
        truncate(f)
    out = tmp_path / "w.json"
    argv = ["warmup", str(source), "--cache-dir", str(tmp_path / "cache"), "--redis", redis_server.url,
            "--cache-size", str(SIZE), "--workers", "1", "--quiet", "--json", str(out)]
    assert cli(argv) == 0
    first = json.loads(out.read_text())
    assert len(first["corrupt"]) == 2 and first["l1_written"] == 24  # L1 mirrors the files as they are
    l1 = tmp_path / "cache" / first["fingerprint"] / "l1"
    txn = _last_txn(l1)
    assert cli(argv) == 0
    again = json.loads(out.read_text())
    assert again["nothing_to_do"] and again["l1_written"] == 0 and again["l2_written"] == 0
    assert len(again["known_corrupt"]) == 2 and _last_txn(l1) == txn  # not one L1 transaction
    capsys.readouterr()
    stats = ["stats", str(source), "--cache-dir", str(tmp_path / "cache"), "--redis", redis_server.url]
    assert cli([*stats, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["l2"]["sizes"][0]
    assert (row["present"], row["known_corrupt"], row["percent"]) == (22, 2, 100.0)
    assert cli(stats) == 0
    assert "22/24 (100.0 % of the 22 that decode; 2 known corrupt" in capsys.readouterr().out
