"""The intra-node shared-memory transport (comm/shm.py) in real gloo groups: its collectives
equal the process group's, the segment grows between calls, the algorithms give the same
results over either transport, and nothing is left in /dev/shm."""
from __future__ import annotations

import glob
import os

import pytest
import torch
import torch.distributed as dist

from comm import Topology, build_exchanger
from comm.collectives.base import all_gather_flat, reduce_scatter_flat
from comm.shm import SHM_DIR
from tests.comm._workers import portable, restore
from tests.distributed import run_distributed

# (numel, dtype): growing past the first 1 MiB segment, uneven chunks, and back to small
CALLS = [(10, torch.float32), (7, torch.float64), (300_001, torch.float32), (5, torch.bfloat16),
         (400_000, torch.float64)]


def _integers(rank: int, step: int, d: int, dtype) -> torch.Tensor:
    """Integer-valued data: sums are exact in any order, so both transports must agree bit for bit."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randint(-64, 64, (d,), generator=g).to(dtype)


def _leftovers(name: str) -> list[str]:
    return glob.glob(os.path.join(SHM_DIR, name + "*"))


def shm_ops(rank, world, nodes, local_size):
    topo = Topology(nodes=nodes, local_size=local_size)
    shm, group, n = topo.shm, topo.intra_group, local_size
    x = torch.ones(1000)
    out = {"small_declined": shm.reduce_scatter(x) is None and shm.all_gather(x) is None}
    shm.min_bytes = 0  # carry everything here, to test small and uneven sizes too
    out |= {"has_shm": shm is not None,
           "disabled": Topology(nodes=nodes, local_size=local_size, shared_memory=False).shm is None}
    out["name"], out["leftovers"] = shm.name, _leftovers(shm.name)
    leader = topo.intra_ranks[0]
    checks, capacities, first = [], [], None
    for step, (d, dtype) in enumerate(CALLS):
        x = _integers(rank, step, d, dtype)
        want = reduce_scatter_flat(x, group, n)                 # the process group's answer
        checks.append(("reduce_scatter", d, torch.equal(shm.reduce_scatter(x), want)))
        got = shm.all_gather(x)
        checks.append(("all_gather", d, torch.equal(got, all_gather_flat(x, group, n))))
        if first is None:
            first = (got, got.clone())  # results never alias the segment
        a, b = x.clone(), x.clone()
        shm.reduce_(a)
        dist.reduce(b, dst=leader, group=group)
        checks.append(("reduce_", d, torch.equal(a, b) if topo.is_leader else torch.equal(a, x)))
        a, b = x.clone(), x.clone()
        shm.broadcast_(a)
        dist.broadcast(b, src=leader, group=group)
        checks.append(("broadcast_", d, torch.equal(a, b)))
        capacities.append(shm.capacity)
    checks.append(("no alias", 0, torch.equal(*first)))
    if n == 2:  # two summands: float sums commute, so even random data matches exactly
        x = torch.randn(1001, generator=torch.Generator().manual_seed(rank))
        checks.append(("randn", 1001, torch.equal(shm.reduce_scatter(x), reduce_scatter_flat(x, group, n))))
    out["checks"], out["capacities"] = checks, capacities
    # every algorithm gives the same result over shared memory and over the process group
    plain = Topology(nodes=nodes, local_size=local_size, shared_memory=False)
    x = _integers(rank, 99, 20_001, torch.float32)
    out["algorithms"] = {}
    for name in ("hier", "2dtar", "hitopk"):
        kw = {"density": 0.05, "selector": "exact"} if name == "hitopk" else {}
        ex, ref = build_exchanger(name, topo, **kw), build_exchanger(name, plain, **kw)
        if name != "hitopk":
            ex.segment_bytes = ref.segment_bytes = 4 * 3000  # several pipelined segments
        out["algorithms"][name] = (ex.exchange(x), ref.exchange(x))
    out["leftovers_after"] = _leftovers(shm.name)
    return portable(out)


def fail_while_growing(rank, world, report):
    """Rank 1 raises instead of joining a collective that grows the segment; rank 0 notes
    its segment's name and that the collective raised (rather than hanging)."""
    topo = Topology(nodes=1, local_size=world)
    if rank == 1:
        raise RuntimeError("worker 1 fails on purpose")
    try:
        topo.shm.all_gather(torch.zeros(2**20))  # 4 MiB: needs a new segment that worker 1 never maps
    except RuntimeError:
        with open(report, "w") as f:
            f.write(topo.shm.name)
        raise


@pytest.mark.parametrize("nodes,local_size", [(2, 2), (1, 3)], ids=["2x2", "1x3"])
def test_shm_collectives_equal_process_group(nodes, local_size):
    results = restore(run_distributed(shm_ops, nodes * local_size, nodes, local_size))
    for rank, res in enumerate(results):
        assert res["has_shm"] and res["disabled"] and res["small_declined"], rank
        assert [c for c in res["checks"] if not c[2]] == [], rank
        caps = res["capacities"]
        assert caps[0] == 2**20 and caps[2] > caps[0] and caps == sorted(caps), caps  # grows, never shrinks
        for name, (got, want) in res["algorithms"].items():
            assert torch.equal(got, want), (rank, name)
        assert res["leftovers"] == [] and res["leftovers_after"] == [], rank
        assert _leftovers(res["name"]) == []


def test_no_segment_left_when_a_worker_fails(tmp_path):
    report = tmp_path / "raised"
    with pytest.raises(AssertionError, match="fails on purpose"):
        run_distributed(fail_while_growing, 2, str(report), timeout=60)
    name = report.read_text()
    assert name.startswith("cachepipe-comm-")
    assert _leftovers(name) == []


def small_file_limit(rank, world):
    """Local rank 0 may not create files over 4 MiB (a real RLIMIT_FSIZE, as a small /dev/shm
    would refuse): bigger operations fall back to the process group on every member."""
    import resource
    import signal

    if rank == 0:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 * 2**20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    topo = Topology(nodes=1, local_size=world)
    plain = Topology(nodes=1, local_size=world, shared_memory=False)
    shm, group = topo.shm, topo.intra_group
    shm.min_bytes = 0
    checks = []
    for step, d in enumerate([1000, 600_000, 1000, 700_000]):  # 600k floats: a 4.8 MB segment
        x = _integers(rank, step, d, torch.float32)
        checks.append(torch.equal(reduce_scatter_flat(x, group, world, shm), reduce_scatter_flat(x, group, world)))
        checks.append(torch.equal(all_gather_flat(x, group, world, shm), all_gather_flat(x, group, world)))
        hier = [build_exchanger("hier", t).exchange(x) for t in (topo, plain)]
        checks.append(torch.equal(*hier))
    return checks, shm.capacity, _leftovers(shm.name)


def test_operations_that_do_not_fit_use_the_process_group():
    for checks, capacity, leftovers in run_distributed(small_file_limit, 2):
        assert all(checks) and capacity <= 4 * 2**20 and leftovers == []
