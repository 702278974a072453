"""Issue 32, item 10: the ACL docs/cache.md recommends is enough for every command, and a
command the user may not run is reported as a permission error naming it and the shard.

A real redis-server with a real ACL user (the line of docs/cache.md, run as written); the
server's own ``ACL LOG`` must stay empty.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from cachepipe import TwoLevelCache
from tools.cli import main as cli

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cache.md"


def _documented_acl() -> list[str]:
    line = next(ln.strip() for ln in DOCS.read_text().splitlines() if ln.strip().startswith("ACL SETUSER cachepipe"))
    return line.split()


def _user(server, name: str, without: tuple[str, ...] = ()) -> str:
    argv = [a for a in _documented_acl() if a not in without]
    argv[2] = name
    server.client().execute_command(*argv)
    return f"redis://{name}:secret@127.0.0.1:{server.port}/0"


def test_the_documented_acl_runs_every_command(source, tmp_path, redis_server, capsys):
    url = _user(redis_server, "cachepipe")
    flags = ["--cache-dir", str(tmp_path / "cache"), "--redis", url, "--cache-size", "32"]
    assert cli(["warmup", str(source), *flags, "--workers", "1", "--quiet"]) == 0
    assert cli(["stats", str(source), *flags, "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out[out.index("{"):])["l2"]["sizes"][0]["present"] == 24
    with TwoLevelCache(source, tmp_path / "cache", [url], 32) as cache:
        cache.get_many(range(24))
        assert cache.stats()["l2_hits"] == 24
    (source / "class_0000" / "new.JPEG").write_bytes(next(source.rglob("*.JPEG")).read_bytes())  # a new version
    with TwoLevelCache(source, tmp_path / "cache", [url], 32) as cache:
        cache.get_many(range(25))  # training writes its misses back
    assert cli(["drop", str(source), *flags]) == 0
    assert "dropped 1 namespace(s)" in capsys.readouterr().out
    assert redis_server.client().execute_command("ACL", "LOG") == []  # not one denied command


def test_a_denied_command_is_named_with_the_shard_not_unreachable(source, tmp_path, redis_server, capsys):
    full = _user(redis_server, "cachepipe")
    assert cli(["warmup", str(source), "--cache-dir", str(tmp_path / "cache"), "--redis", full,
                "--cache-size", "32", "--workers", "1", "--quiet"]) == 0
    capsys.readouterr()
    url = _user(redis_server, "limited", without=("+hdel", "+scan"))
    flags = ["--cache-dir", str(tmp_path / "cache"), "--redis", url, "--cache-size", "32"]
    assert cli(["warmup", str(source), *flags, "--workers", "1", "--quiet"]) == 4
    err = capsys.readouterr().err
    shown = f"redis://limited:***@127.0.0.1:{redis_server.port}/0"
    assert f"L2 shard {shown} refused HDEL: permission denied" in err and "secret" not in err
    assert cli(["stats", str(source), *flags]) == 4
    out, err = capsys.readouterr()
    assert re.search(f"L2 shard {re.escape(shown)} refused SCAN: permission denied", err) and "secret" not in out + err
    assert "nothing cached" not in out and "could not be read" in out
