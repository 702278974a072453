"""Issue 32, item 17: the namespaces of older versions of a source can be dropped, and a
warm-up that finds L2 too small says when they hold the room.

A real redis-server with ``maxmemory`` and ``noeviction``; a new version of the source is a
real change to a file (a new fingerprint); the real command line.
"""
from __future__ import annotations

import json
import os

from tools.cli import main as cli
from tools.demo_dataset import make_dataset


def test_older_versions_are_named_by_the_warmup_and_dropped(tmp_path, redis_servers, capsys):
    data = make_dataset(tmp_path / "data", classes=4, per_class=10, val_per_class=2, size=64)
    server = redis_servers(1, maxmemory="5mb")[0]
    cache = str(tmp_path / "cache")
    flags = ["--cache-dir", cache, "--redis", server.url, "--cache-size", "128"]

    def warm(split: str) -> dict:
        assert cli(["warmup", str(data / split), *flags, "--workers", "1", "--quiet", "--json",
                    str(tmp_path / "w.json")]) == 0
        return json.loads((tmp_path / "w.json").read_text())

    val = warm("val")  # another source in the same cache dir: never touched
    old = warm("train")
    assert old["l2_uncached"] == 0
    victim = next((data / "train").rglob("*.JPEG"))
    os.utime(victim, ns=(0, victim.stat().st_mtime_ns + 10**9))  # a new version of the source
    capsys.readouterr()
    new = warm("train")
    assert new["fingerprint"] != old["fingerprint"] and new["l2_uncached"] > 0
    assert new["stale_fingerprints"] == [old["fingerprint"]] and new["l2_stale_keys"] >= old["l2_cached"]
    out = capsys.readouterr().out
    assert "L2 keys of older versions of this source" in out and f"cachepipe drop {data / 'train'}" in out
    assert cli(["stats", str(data / "train"), *flags]) == 0
    assert f"older versions of this source: {old['fingerprint']}" in capsys.readouterr().out
    assert cli(["drop", str(data / "train"), *flags, "--dry-run"]) == 0
    assert "would drop 1 namespace(s)" in capsys.readouterr().out
    assert cli(["drop", str(data / "train"), *flags, "--json"]) == 0
    dropped = json.loads(capsys.readouterr().out)
    assert dropped["fingerprints"] == [old["fingerprint"]] and dropped["l2_keys"] >= old["l2_cached"]
    client = server.client()
    assert list(client.scan_iter(f"cachepipe:{old['fingerprint']}:*")) == []
    assert not (tmp_path / "cache" / old["fingerprint"]).exists()
    assert (tmp_path / "cache" / new["fingerprint"]).is_dir() and (tmp_path / "cache" / val["fingerprint"]).is_dir()
    assert len(list(client.scan_iter(f"cachepipe:{val['fingerprint']}:*"))) == val["l2_cached"]
    again = warm("train")  # the room is back
    assert again["l2_uncached"] == 0 and again["l2_stale_keys"] == 0
    assert cli(["drop", str(data / "train"), *flags, "--fingerprint", again["fingerprint"]]) == 2
    assert "current one" in capsys.readouterr().err
