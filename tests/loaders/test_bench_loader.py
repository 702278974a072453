"""`cachepipe bench loader` runs end to end on a tiny dataset and writes the documented rows."""
from __future__ import annotations

import json

import torch

from loaders import dali_available
from tools.cli import main


def test_bench_loader_writes_rows(source, cache_dir, tmp_path):
    out = tmp_path / "loader.json"
    kinds = "plain,cached,cached-tcp,dali" if dali_available() else "plain,cached,cached-tcp"
    threads = torch.get_num_threads()  # the benchmark pins the process to one intra-op thread
    rc = main(["bench", "loader", str(source), "--cache-dir", str(cache_dir), "--workers", "1",
               "--size", "24", "--cache-size", "32", "--batch-size", "4", "--batches", "2", "--rounds", "1",
               "--loaders", kinds, "--json", str(out)])
    torch.set_num_threads(threads)
    assert rc == 0
    rows = json.loads(out.read_text())
    assert [r["loader"] for r in rows] == kinds.split(",")
    assert rows[0]["l2"] == "-" and rows[1]["l2"].startswith("unix socket, embedded (redis ")
    assert rows[2]["l2"].startswith("tcp 127.0.0.1 (redis ")  # a real redis-server over TCP, bundled by default
    for r in rows:
        assert r["workers"] == 1 and r["size"] == 24 and r["images_per_s"] > 0
        assert r["cpu_ms_per_image"] >= 0 and r["fetch_ms_per_batch"] >= 0  # CPU ticks are 10 ms: may read 0
        assert r["batches"] >= 2
    assert rows[0]["speedup"] == 1.0
