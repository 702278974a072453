"""Issue 32, item 13: every command works from any working directory.

``redis-server`` changes into its ``--dir`` before it opens ``--logfile``; given a relative
pair (``bench train --emulate`` with its default relative ``--out``) it could not open
its log and never started. Real servers started from a working directory of relative
paths: the benchmark's TCP server, an emulated node's server (network namespaces, root),
and ``bench loader --loaders cached-tcp`` end to end.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cachepipe.server.embedded import EmbeddedRedis
from tools.bench.harness.cluster import EmulatedCluster, netns_unavailable_reason
from tools.bench.harness.redis import private_redis

ROOT = Path(__file__).resolve().parents[2]
NETNS = netns_unavailable_reason()


def test_the_benchmark_tcp_server_starts_from_a_relative_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    server = private_redis(Path("rel") / "tcp")
    try:
        assert server.client().ping()
        assert (tmp_path / "rel" / "tcp" / "redis.log").is_file()
    finally:
        server.stop()


@pytest.mark.netns
@pytest.mark.skipif(NETNS is not None, reason=str(NETNS))
def test_an_emulated_nodes_server_starts_from_a_relative_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with EmulatedCluster(nodes=1, inter_mbit=100) as cluster:
        with private_redis(Path("rel") / "node0", cluster=cluster, node=0, maxmemory="16mb", port=6417) as server:
            assert server.log == tmp_path / "rel" / "node0" / "redis.log" and server.log.is_file()


def test_bench_loader_with_relative_paths(tiny_dataset, tmp_path):
    (tmp_path / "data").symlink_to(tiny_dataset / "train")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    try:
        r = subprocess.run([sys.executable, "-m", "tools", "bench", "loader", "data", "--cache-dir", "cache",
                            "--loaders", "cached-tcp", "--batch-size", "4", "--batches", "1", "--rounds", "1",
                            "--workers", "1", "--size", "32", "--cache-size", "36"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "cached-tcp" in r.stdout
    finally:
        EmbeddedRedis(tmp_path / "cache").stop()
