"""Item 6 of issue 17: shared-memory segments never outlive a crash for long.

Real faults: local rank 0 SIGKILLed (by its peer, which knows its pid from the group) while
it grows the segment and its peer is slow; a segment left by a real SIGKILLed process;
segments that must be kept (a live maker, another user's, an unparseable name).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import torch

from comm.shm_names import SHM_DIR, maker_alive, new_base
from tests.faults.train_faults import run_ranks


def _mine(pid: int) -> list[str]:
    return [n for n in os.listdir(SHM_DIR) if f".p{pid}.t" in n]


def _leader_killed_while_growing(rank, world):
    import torch.distributed as dist

    from comm import Topology

    topo = Topology(nodes=1, local_size=2)
    topo.shm.min_bytes = 0
    pids = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(pids, torch.tensor([os.getpid()]))
    leader = int(pids[0])
    if rank == 0:
        topo.shm.all_gather(torch.ones(2**20))  # grows the segment: waits for the slow peer in there
        return None
    time.sleep(2)  # the slow peer: rank 0 is now waiting inside the growth
    os.kill(leader, signal.SIGKILL)  # our own job's rank 0, its pid from the group above
    while os.path.exists(f"/proc/{leader}") and open(f"/proc/{leader}/stat").read().split()[2] != "Z":
        time.sleep(0.05)
    return _mine(leader)


def test_a_leader_killed_while_waiting_for_a_slow_peer_leaves_no_segment():
    assert run_ranks(_leader_killed_while_growing, 2, report=(1,), timeout=120)[1] == []


def _start_group(rank, world):
    from comm import Topology

    return Topology(nodes=1, local_size=2).shm is not None


def test_a_new_group_removes_segments_of_dead_makers_only(tmp_path):
    maker = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, time\n"
        "from comm.shm_names import SHM_DIR, new_base\n"
        "name = new_base() + '-1'\n"
        "open(os.path.join(SHM_DIR, name), 'wb').write(b'x' * 4096)\n"
        "print(name, flush=True)\n"
        "time.sleep(600)\n")], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    dead = maker.stdout.readline().strip()
    assert maker_alive(dead) is True
    maker.kill()  # SIGKILL: it cannot clean up
    maker.wait()
    assert maker_alive(dead) is False
    live = new_base() + "-1"  # this test process: alive
    foreign = dead.replace(".n", ".n1", 1)  # another pid namespace: cannot tell
    others = dead + "7"  # a dead maker, but another user's file
    kept = [live, foreign, others, "cachepipe-comm-0123456789abcdef-1"]  # the last: an old-style name
    for name in kept:
        open(os.path.join(SHM_DIR, name), "wb").close()
    os.chown(os.path.join(SHM_DIR, others), 65534, 65534)
    try:
        assert all(run_ranks(_start_group, 2, report=(0, 1)).values())
        assert not os.path.exists(os.path.join(SHM_DIR, dead))
        assert all(os.path.exists(os.path.join(SHM_DIR, name)) for name in kept)
    finally:
        for name in [dead, *kept]:
            if os.path.exists(os.path.join(SHM_DIR, name)):
                os.unlink(os.path.join(SHM_DIR, name))
