"""Warm-up: both levels filled, nothing left for a second run, partitions, corrupt files,
and a run killed mid-way that a second run completes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from cachepipe import Manifest, TwoLevelCache
from cachepipe.l1.mirror import L1Mirror
from cachepipe.l2.placement import LocalityError
from cachepipe.warmup import warmup
from loaders import cached_dataloader
from tests.cachepipe.conftest import reference_pixels, truncate
from tools.demo_dataset import make_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_fills_both_levels_then_nothing_to_do(source, cache_dir, redis_servers):
    urls = [s.url for s in redis_servers(2)]
    with TwoLevelCache(source, cache_dir, urls, 32) as cache:
        n = len(cache)
        r = warmup(cache, workers=2, batch_size=5, progress=False)
        assert (r["samples"], r["l1_written"], r["l2_written"], r["corrupt"]) == (n, n, n, [])
        assert r["bytes_read"] == cache.manifest.total_bytes and not r["nothing_to_do"]
        assert cache.l1.entries() == n and cache.store.missing(list(range(n))) == []
        again = warmup(cache, workers=2, progress=False)
        assert again["nothing_to_do"] and again["l1_written"] == again["l2_written"] == 0
        got = cache.get_many(range(n))
        assert cache.stats()["l2_hits"] == n and cache.stats()["source_reads"] == 0
        np.testing.assert_array_equal(got[5], reference_pixels(open(cache.manifest.path(5), "rb").read(), 32))


def test_node_partitions_are_the_placement_node_local_sampling_draws_by(source, cache_dir, redis_servers):
    servers = redis_servers(2)
    clients = [s.client() for s in servers]
    with TwoLevelCache(source, cache_dir, [s.url for s in servers], 32) as cache:
        n = len(cache)
        r0 = warmup(cache, node_rank=0, num_nodes=2, l1_scope="partition", progress=False)
        # node 0 wrote exactly the samples its own server holds, none to node 1's server
        on0 = sorted(i for i in range(n) if clients[0].exists(f"{cache.namespace}{i}"))
        assert 0 < len(on0) < n and clients[1].dbsize() == 0
        assert r0["partition"] == r0["l2_written"] == r0["l1_written"] == len(on0)
        loader = cached_dataloader(source, cache=cache, batch_size=2, train=True, size=16, workers=0,
                                   distributed=(0, 4), local_size=2, locality="node")
        assert np.flatnonzero(loader.sampler.locality.home == 0).tolist() == on0  # what node 0's ranks draw
        r1 = warmup(cache, node_rank=1, num_nodes=2, progress=False)  # l1_scope="all"
        assert r1["l2_written"] == n - len(on0) and r1["l1_written"] == n - len(on0)
        assert clients[0].dbsize() == len(on0) and cache.store.missing(list(range(n))) == []
        assert cache.l1.entries() == n
        with pytest.raises(ValueError, match="node_rank"):
            warmup(cache, node_rank=2, num_nodes=2)
        with pytest.raises(LocalityError, match="3 nodes need one Redis URL per node.* 2 URL"):
            warmup(cache, node_rank=0, num_nodes=3)


def test_corrupt_files_are_reported_once_known(source, cache_dir, redis_server):
    relpaths = Manifest.scan(source).relpaths
    bad = sorted([relpaths[2], relpaths[9]])
    for rel in bad:
        truncate(source / rel)
    with TwoLevelCache(source, cache_dir, redis_server.url, 32) as cache:
        r = warmup(cache, progress=False)
        assert r["corrupt"] == bad and r["l2_written"] == len(cache) - 2
        assert r["l1_written"] == len(cache)  # L1 mirrors the files as they are
        again = warmup(cache, progress=False)
        assert again["nothing_to_do"] and again["known_corrupt"] == bad and again["corrupt"] == []


def test_killed_warmup_resumes(tmp_path, redis_server):
    src = make_dataset(tmp_path / "data", classes=3, per_class=200, val_per_class=0, size=24) / "train"
    cache_dir = tmp_path / "cache"
    with TwoLevelCache(src, cache_dir, redis_server.url, 256) as cache:
        n = len(cache)
        l1_path = cache.l1_path
    cmd = [sys.executable, "-m", "tools", "warmup", str(src), "--cache-dir", str(cache_dir),
           "--redis", redis_server.url, "--workers", "1", "--batch-size", "4", "--quiet"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (l1_path / "data.mdb").exists() or L1Mirror(l1_path, 1 << 30, readonly=True).entries() < 40:
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with TwoLevelCache(src, cache_dir, redis_server.url, 256) as cache:
        done_l1 = cache.l1.entries()
        done_l2 = n - len(cache.store.missing(list(range(n))))
        assert 40 <= done_l1 < n, "the warm-up finished before it could be killed"
        r = warmup(cache, progress=False)
        assert r["l1_written"] == n - done_l1 and r["l2_written"] == n - done_l2
        values, corrupt = cache.l1.get_many(list(range(n)))
        assert corrupt == [] and all(v is not None for v in values)
        got = cache.get_many([0, done_l1 - 1, n - 1])
        assert cache.stats()["l2_hits"] == 3
        for i, arr in zip([0, done_l1 - 1, n - 1], got):
            np.testing.assert_array_equal(arr, reference_pixels(values[i], 256))
