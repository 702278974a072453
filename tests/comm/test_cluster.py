"""The emulated cluster and ``cachepipe bench comm`` end to end (needs root + iproute2)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tools.bench.harness.cluster import EmulatedCluster, netns_unavailable_reason

REASON = netns_unavailable_reason()
pytestmark = [pytest.mark.netns, pytest.mark.skipif(REASON is not None, reason=str(REASON))]

_ECHO = "import socket,sys; s=socket.create_connection((sys.argv[1], 5999)); s.sendall(b'hi'); s.close()"
_SERVE = ("import socket,sys; s=socket.socket(); s.bind((sys.argv[1], 5999)); s.listen(1); c,_=s.accept(); "
          "print(c.recv(16).decode())")


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_nodes_talk_over_the_limited_link_and_vanish_on_close():
    cluster = EmulatedCluster(nodes=2, inter_mbit=100)
    with cluster:
        assert all(ns in _namespaces() for ns in cluster.namespaces + [cluster.switch])
        tc = subprocess.run(cluster.command(1, ["tc", "qdisc", "show", "dev", "eth0"]), capture_output=True, text=True)
        assert "tbf" in tc.stdout and "100Mbit" in tc.stdout
        server = subprocess.Popen(cluster.command(0, [sys.executable, "-c", _SERVE, cluster.address(0)]),
                                  stdout=subprocess.PIPE, text=True)
        for _ in range(50):  # retry until the server listens
            if subprocess.run(cluster.command(1, [sys.executable, "-c", _ECHO, cluster.address(0)]),
                              capture_output=True).returncode == 0:
                break
        assert server.communicate(timeout=30)[0].strip() == "hi"
    assert not any(ns in _namespaces() for ns in cluster.namespaces + [cluster.switch])


def test_cluster_is_removed_when_setup_fails():
    cluster = EmulatedCluster(nodes=2, inter_mbit=100)
    cluster.namespaces[1] = cluster.namespaces[0]  # second `ip netns add` of the same name fails
    with pytest.raises(RuntimeError, match="netns add"):
        cluster.start()
    assert cluster.namespaces[0] not in _namespaces() and cluster.switch not in _namespaces()


def test_bench_comm_runs_on_namespaces_and_writes_rows(tmp_path):
    from tools.bench.harness.output import read_rows
    from tools.cli import main

    out = tmp_path / "rows.json"
    assert main(["bench", "comm", "--emulate", "2x1@200", "--sizes", "20000", "--reps", "1", "--algorithms",
                 "dense", "hitopk", "--json", str(out)]) == 0
    rows = read_rows(out)
    assert [r["algorithm"] for r in rows] == ["dense", "hitopk"]
    for r in rows:
        for key in ("nodes", "local_size", "inter_mbit", "numel", "density", "median_s", "predicted_s"):
            assert key in r
        assert r["inter_mbit"] == 200 and r["median_s"] > 0
