"""NOTE [L1 holds what the node reads]: under node-local sampling two nodes' warm-ups read
each source file once in all, and each node's L1 holds its partition only."""
from __future__ import annotations

from collections import Counter

from cachepipe import TwoLevelCache, capacity
from cachepipe.source import reader
from cachepipe.warmup import node_partition, warmup
from tools.warmup import _l1_line


def test_two_nodes_read_each_file_once_under_node_local_sampling(source, tmp_path, redis_servers, monkeypatch):
    urls = [s.url for s in redis_servers(2)]
    real, reads = reader.open_regular, Counter()

    def counted(path, *args, **kwargs):  # every open of a source file, whoever opens it
        reads[path] += 1
        return real(path, *args, **kwargs)

    monkeypatch.setattr(reader, "open_regular", counted)
    monkeypatch.setattr(capacity, "open_regular", counted)  # the L2 size estimate's header reads
    parts = []
    for rank in (0, 1):
        with TwoLevelCache(source, tmp_path / f"node{rank}", urls, 32) as cache:
            report = warmup(cache, node_rank=rank, num_nodes=2, locality="node", progress=False)
            part = node_partition(cache, node_rank=rank, num_nodes=2)
            assert report["l1_scope"] == "partition" and report["l1_written"] == len(part)
            assert cache.l1.present().tolist() == part.tolist()  # its partition, nothing else
            assert "partition only" in _l1_line(report, f"node {rank} of 2")
            parts.append(set(part.tolist()))
            n = len(cache)
            paths = {cache.manifest.path(i) for i in range(n)}
    assert not parts[0] & parts[1] and len(parts[0] | parts[1]) == n
    assert set(reads) == paths and set(reads.values()) == {1}  # each file once per job


def test_global_sampling_mirrors_everything_and_says_so(source, tmp_path, redis_servers):
    urls = [s.url for s in redis_servers(2)]
    with TwoLevelCache(source, tmp_path / "node0", urls, 32) as cache:
        report = warmup(cache, node_rank=0, num_nodes=2, progress=False)
        assert report["l1_scope"] == "all" and cache.l1.entries() == len(cache)
        assert "every node reads every file" in _l1_line(report, "node 0 of 2")
