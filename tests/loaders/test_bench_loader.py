"""`cachepipe bench loader` runs end to end on a tiny dataset and writes the documented rows."""
from __future__ import annotations

import pytest
import torch

from loaders import dali_available
from tools.bench.harness.output import read_rows
from tools.cli import main
from tools.bench.harness.cluster import netns_unavailable_reason

NETNS = netns_unavailable_reason()


def test_bench_loader_writes_rows(source, cache_dir, tmp_path):
    out = tmp_path / "loader.json"
    kinds = "plain,cached,cached-tcp,dali" if dali_available() else "plain,cached,cached-tcp"
    threads = torch.get_num_threads()  # the benchmark pins the process to one intra-op thread
    rc = main(["bench", "loader", str(source), "--cache-dir", str(cache_dir), "--workers", "1",
               "--size", "24", "--cache-size", "32", "--batch-size", "4", "--batches", "2", "--rounds", "1",
               "--loaders", kinds, "--also-l2", "shm://", "--shm-memory", "64mb", "--json", str(out)])
    torch.set_num_threads(threads)
    assert rc == 0
    rows = read_rows(out)
    assert [r["loader"] for r in rows] == [kinds.split(",")[0], "cached", *kinds.split(",")[1:]]
    assert rows[0]["l2"] == "-" and rows[1]["l2"].startswith("embedded: 1 server(s) on Unix sockets (redis ")
    assert rows[2]["l2"].startswith("shm: shm:///dev/shm/cachepipe-bench-")  # --also-l2: the same loader from shm
    assert rows[3]["l2"].startswith("tcp 127.0.0.1 (redis ")  # a real redis-server over TCP, bundled by default
    for r in rows:
        assert r["workers"] == 1 and r["size"] == 24 and r["images_per_s"] > 0
        assert r["cpu_ms_per_image"] >= 0 and r["fetch_ms_per_batch"] >= 0  # CPU ticks are 10 ms: may read 0
        assert r["batches"] >= 2
    assert rows[0]["speedup"] == 1.0


@pytest.mark.netns
@pytest.mark.skipif(NETNS is not None, reason=str(NETNS))
def test_bench_loader_emulated_compares_node_and_global(source, tmp_path):
    out = tmp_path / "emulated.json"
    rc = main(["bench", "loader", str(source), "--cache-dir", str(tmp_path / "cache"), "--emulate", "2x1@200",
               "--locality", "node,global", "--exchange-fraction", "0", "--workers", "0", "--size", "24",
               "--cache-size", "64", "--batch-size", "4", "--epochs", "1", "--rounds", "1", "--json", str(out)])
    assert rc == 0
    rows = {r["locality"]: r for r in read_rows(out)}
    assert set(rows) == {"node", "global"}
    for r in rows.values():
        assert r["images_per_s"] > 0 and r["l2_hit_rate"] == 1.0  # each node's warm-up filled L2
        assert r["images"] == 2 * 24  # one untimed and one timed epoch, drop_last: 24 = 2 ranks x 3 x 4
    # global reads about half of the ~12 KB samples from the other node; node-local only the balancing moves
    assert rows["global"]["inter_node_bytes_per_image"] > 3000
    assert rows["node"]["inter_node_bytes_per_image"] < 0.5 * rows["global"]["inter_node_bytes_per_image"]


@pytest.mark.parametrize("args,match", [
    (["--emulate", "2x@200"], r"--emulate '2x@200': expected MxN\[@MBIT\]"),
    (["--emulate", "2x2@200", "--locality", "rack"], r"--locality 'rack': unknown \['rack'\]; valid: \['node', 'global'\]"),
    (["--emulate", "2x2@200", "--redis", "redis://127.0.0.1:1/0"], "--emulate starts one Redis per node"),
    (["--emulate", "2x2@200", "--exchange-fraction", "1.5"], r"--exchange-fraction must be in \[0, 1\]"),
])
def test_bench_loader_emulated_bad_flags_are_one_line_errors(source, tmp_path, capsys, args, match):
    import re

    rc = main(["bench", "loader", str(source), "--cache-dir", str(tmp_path / "cache"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and re.search(match, err[0]), err
