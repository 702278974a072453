"""Issue 46, defect 10: a benchmark of an emulated cluster killed with SIGKILL left its ranks
training inside their namespaces, its per-node redis-servers and its network namespaces.

A real child process builds an emulated cluster (network namespaces), starts one owned
``redis-server`` per node inside it and a job of ranks (two new interpreters, two forked from
the fork server), then is killed with SIGKILL; everything it started must go with it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tools.bench.harness.cluster import netns_unavailable_reason

REASON = netns_unavailable_reason()
ROOT = Path(__file__).resolve().parents[2]

_BENCH = """
import sys
from pathlib import Path
from tools.bench.harness.cluster import EmulatedCluster
from tools.bench.harness.jobs import launch
from tools.bench.harness.redis import node_servers

work = Path(sys.argv[1])
probe = str(Path(sys.argv[2]) / "tests" / "tools" / "rank_probe.py")
argv = lambda rank: [sys.executable, *(["-m", "tests.tools.rank_probe"] if rank % 2 else [probe]), "sleep"]
with EmulatedCluster(nodes=2, inter_mbit=100) as cluster:
    with node_servers(cluster, [work / "redis0", work / "redis1"]):
        (work / "namespaces").write_text(" ".join([cluster.switch, *cluster.namespaces]))
        launch(cluster, argv, local_size=2, timeout=120)
"""


def _marked(token: bytes, work: Path) -> list[tuple[int, str]]:
    """The bench's processes: those whose environment carries ``token``, and those working in
    ``work`` (a redis-server writes its title over its environment)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (token in (entry / "environ").read_bytes().split(b"\0")
                                         or Path(os.readlink(entry / "cwd")).is_relative_to(work)):
                found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]))
        except OSError:
            continue
    return found


def _netns() -> set[str]:
    return set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())


@pytest.mark.netns
@pytest.mark.skipif(REASON is not None, reason=str(REASON))
def test_a_bench_killed_with_sigkill_leaves_no_rank_server_or_namespace(tmp_path):
    mark = f"CACHEPIPE_TEST_KILLED_BENCH={uuid.uuid4().hex}"
    env = {**os.environ, mark.split("=")[0]: mark.split("=")[1], "PYTHONPATH": str(ROOT)}
    bench = subprocess.Popen([sys.executable, "-c", _BENCH, str(tmp_path), str(ROOT)], env=env, cwd=ROOT)
    token = mark.encode()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the cluster, the 2 servers and the 4 ranks are up
            procs = _marked(token, tmp_path)
            if (tmp_path / "namespaces").exists() and sum("multiprocessing.forkserver" in c or "rank_probe" in c
                                                          for _, c in procs) >= 5:  # 4 ranks, 1 fork server
                break
            assert bench.poll() is None, "the bench ended early"
            time.sleep(0.1)
        names = set((tmp_path / "namespaces").read_text().split())
        assert names <= _netns() and sum("redis-server" in c for _, c in procs) == 2
        bench.send_signal(signal.SIGKILL)
        bench.wait()
        deadline = time.monotonic() + 10
        while (_marked(token, tmp_path) or names & _netns()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _marked(token, tmp_path)  # ranks, servers, fork server, watchers: all gone
        assert not names & _netns()
    finally:
        for pid, _ in _marked(token, tmp_path):  # ours: they carry this test's mark or work in its directory
            os.kill(pid, signal.SIGKILL)
        if bench.poll() is None:
            bench.kill()


@pytest.mark.netns
@pytest.mark.skipif(REASON is not None, reason=str(REASON))
def test_a_new_cluster_removes_only_namespaces_whose_owner_is_gone():
    from tools.bench.harness.cluster import EmulatedCluster
    from tools.bench.harness.netns_watch import start_time

    gone = subprocess.Popen(["sleep", "30"])
    owner = f"{gone.pid}-{start_time(gone.pid)}"
    gone.kill()
    gone.wait()
    stale, live = f"cp-{owner}-zz-sw", f"cp-{os.getpid()}-{start_time(os.getpid())}-zz-n0"
    for name in (stale, live, "cp-1-1-notours"):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        with EmulatedCluster(nodes=1, inter_mbit=100):
            pass
        left = _netns()
        assert stale not in left and live in left and "cp-1-1-notours" in left
    finally:
        for name in (stale, live, "cp-1-1-notours"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
