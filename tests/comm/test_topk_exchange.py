"""The sparse exchanges select with MSTopK's kernel where ``auto`` picks it, with the
kernel's one host sync per selection and none added around it: hitopk, gtopk and topk_ag
through the engine, in a real 2-process gloo group (the kernels in Triton's interpreter)
and, on a GPU machine, over NCCL. ``auto`` is made to pick the kernel here, as a recorded
measurement does on a GPU (NOTE [MSTopK kernel choice])."""
from __future__ import annotations

import os

import pytest
import torch

from tests.distributed import run_distributed
from tests.redis_servers import free_port

SPARSE = ("hitopk", "gtopk", "topk_ag")
pytestmark = [pytest.mark.triton]


def _exchange_syncs(rank, world, device="cpu"):
    """Per algorithm and selector: host syncs of two engine steps, and the kernel's calls."""
    import importlib

    import comm.topk.mstopk_triton as kernels
    from comm import GradientExchanger, SizePlan, Topology
    from tools.bench.parts.topk_counts import HostSyncCounter

    mstopk_module = importlib.import_module("comm.topk.mstopk")  # the package's name is the function
    resolve = mstopk_module.resolve_kernel
    mstopk_module.resolve_kernel = lambda kernel, x, k: "gpu" if kernel == "auto" else resolve(kernel, x, k)
    calls = {"kernel": 0}
    read = kernels.read_summary

    def counted(summary):
        calls["kernel"] += 1
        return read(summary)

    kernels.read_summary = counted
    topo = Topology(nodes=world, local_size=1)
    out = {}
    for algorithm in SPARSE:
        for selector in ("exact", "mstopk"):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Tanh(), torch.nn.Linear(256, 64)).to(device)
            ex = GradientExchanger(model.parameters(), algorithm, topo, density=0.01, selector=selector,
                                   plan=SizePlan(bucket_bytes=1 << 30, hybrid_threshold_bytes=0), skip_nonfinite=False)
            before = (calls["kernel"], kernels.HANDOVERS["count"], kernels.FALLBACKS["count"])
            syncs = 0
            for step in range(2):
                g = torch.Generator().manual_seed(10 * rank + step)
                inputs = torch.randn(32, 128, generator=g).to(device)
                model.zero_grad()
                with HostSyncCounter() as counter:
                    model(inputs).square().mean().backward()
                    ex.synchronize()
                syncs += counter.count
            ex.remove()
            after = (calls["kernel"], kernels.HANDOVERS["count"], kernels.FALLBACKS["count"])
            out[algorithm, selector] = (syncs, [a - b for a, b in zip(after, before)], len(ex.buckets))
    return out


def _check(results):
    for out in results:
        for algorithm in SPARSE:
            exact_syncs, _, _ = out[algorithm, "exact"]
            syncs, (kernel_calls, handovers, fallbacks), buckets = out[algorithm, "mstopk"]
            assert (kernel_calls, handovers, fallbacks) == (2 * buckets, 0, 0), (algorithm, out[algorithm, "mstopk"])
            assert syncs - exact_syncs == kernel_calls, (algorithm, syncs, exact_syncs)  # one per selection


@pytest.mark.skipif(torch.cuda.is_available(), reason="compiled kernels take CUDA tensors only, and gloo's here "
                    "are CPU tensors: the NCCL test below covers a GPU machine")
def test_sparse_exchanges_add_one_sync_per_selection_with_the_kernel():
    _check(run_distributed(_exchange_syncs, 2))


def _nccl_worker(rank, world, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    try:
        queue.put(_exchange_syncs(rank, world, "cuda"))
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_sparse_exchanges_add_one_sync_per_selection_on_nccl():
    world = torch.cuda.device_count()
    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_nccl_worker, args=(r, world, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    _check(results)
