"""The benchmark's emulated cluster: two network namespaces joined by a rate-limited veth."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.omgs.netns import EmulatedCluster, netns_available

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
out = [torch.zeros(3) for _ in range(dist.get_world_size())]
dist.all_gather(out, torch.full((3,), float(dist.get_rank() + 1)))
print("GATHERED", [int(t[0]) for t in out])
dist.destroy_process_group()
"""


@pytest.mark.netns
@pytest.mark.skipif(not netns_available(), reason="needs root and iproute2 (ip, tc)")
def test_gloo_across_emulated_nodes():
    from tests.redis_servers import free_port

    with EmulatedCluster(rate_mbit=100, prefix="omgst", net=212) as cluster:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert "omgst0" in names and "omgst1" in names
        qdisc = subprocess.run(cluster.command(0, ["tc", "qdisc", "show", "dev", "omgstv0"]),
                               capture_output=True, text=True).stdout
        assert "tbf" in qdisc and "100Mbit" in qdisc
        port = str(free_port())
        procs = []
        for rank in range(2):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_PORT=port, PYTHONPATH=str(ROOT),
                       **cluster.env(rank))
            procs.append(subprocess.Popen(cluster.command(rank, [sys.executable, "-c", _SCRIPT]), env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=120) for p in procs]
        assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
        assert all("GATHERED [1, 2]" in o[0] for o in outs)
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "omgst0" not in names and "omgst1" not in names
