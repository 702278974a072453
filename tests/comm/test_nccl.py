"""NCCL paths: the same exchanges on GPUs (skipped with a reason without enough GPUs)."""
from __future__ import annotations

import os

import pytest
import torch

from tests.redis_servers import free_port

NEEDED = 2


def _nccl_worker(rank, world, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    from comm import ALGORITHMS, Topology, build_exchanger

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    try:
        topo = Topology(nodes=world, local_size=1)
        x = torch.full((1000,), float(rank + 1), device="cuda")
        got = {}
        for name in ALGORITHMS:
            ex = build_exchanger(name, topo, density=1.0, selector="exact")
            got[name] = ex.exchange(x).cpu().tolist()
        queue.put((rank, got))
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_nccl_exchanges_equal_the_mean():
    if torch.cuda.device_count() < NEEDED:
        pytest.skip(f"NCCL test needs {NEEDED} GPUs, {torch.cuda.device_count()} present")
    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_nccl_worker, args=(r, NEEDED, port, queue)) for r in range(NEEDED)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    mean = sum(range(1, NEEDED + 1)) / NEEDED
    for got in results.values():
        for name, values in got.items():
            assert values == pytest.approx([mean] * 1000), name
