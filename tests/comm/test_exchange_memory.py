"""Working memory of the exchanges at density 1 (issue 32, item 18), in a real 2-process
gloo group: bytes of tensors allocated and alive at once, counted by
``tools.bench.live_bytes.LiveBytes`` (NOTE [exchange working memory] in
comm/collectives/base.py, NOTE [in-flight budget] in comm/in_flight.py).

Bounds, in units of the fp32 bucket (``4 d`` bytes), for 2 workers:
- one exchange with its result in place: a sparse algorithm sends ``k`` pairs (2 units at
  density 1) and gathers ``P k`` (4), so ``topk_ag``/``hitopk`` peak at 6, ``gtopk`` (a
  merge on top of its selection) at 8; before the fix they took 19-23;
- the DDP hook with every bucket at density 1: besides what torch's all-reduce hook needs,
  one residual per bucket (the model once) and the buffers of the one bucket in flight.
"""
from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from tests.distributed import run_distributed

SPARSE = ["topk_ag", "hitopk", "gtopk"]
DENSE = ["dense", "hier", "2dtar"]
D = 2**16
UNIT = 4 * D
PAIRS_BOUND = {"topk_ag": 6, "hitopk": 6, "gtopk": 8}


def _exchange_peaks(rank, world):
    """Peak bytes of one exchange per algorithm and layout, in buckets."""
    from comm import Topology, build_exchanger
    from tools.bench.live_bytes import LiveBytes

    peaks = {}
    for nodes, local in ((1, 2), (2, 1)):
        topo = Topology(nodes=nodes, local_size=local)
        for name in SPARSE + DENSE:
            ex = build_exchanger(name, topo, density=1.0, selector="exact")
            for step in range(2):  # the first exchange makes the residual; the second is measured
                x = torch.randn(D, generator=torch.Generator().manual_seed(10 * rank + step))
                expected = x.clone()
                torch.distributed.all_reduce(expected)
                with LiveBytes() as probe:
                    got = ex.exchange(x, out=x)
                assert got is x
            assert_close(x, expected / world, rtol=1e-6, atol=1e-6)
            peaks[f"{name}/{nodes}x{local}"] = probe.peak / UNIT
    return peaks


def _both(rank, world):
    return _exchange_peaks(rank, world), _hook_peaks(rank, world)


@pytest.fixture(scope="module")
def runs():
    return run_distributed(_both, 2)


@pytest.mark.parametrize("name", SPARSE + DENSE)
def test_exchange_working_memory_at_density_1_is_a_small_multiple_of_the_bucket(runs, name):
    for peaks, _ in runs:
        for layout in ("1x2", "2x1"):
            peak = peaks[f"{name}/{layout}"]
            # dense: in place, or one 8 MiB segment's copy (2dtar with one worker per node)
            bound = PAIRS_BOUND.get(name, 1.0)
            assert peak <= bound + 0.01, f"{name} {layout}: {peak:.2f} x the bucket at once (bound {bound})"


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(256, 256, bias=False) for _ in range(6)])


def _hook_peaks(rank, world):
    """Peak bytes in backward and the gradients of DDP with torch's all-reduce hook and with
    the sparse hook at density 1, one bucket in flight at a time."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from comm import Topology, register_sparse_hook
    from tools.bench.live_bytes import LiveBytes

    topo = Topology(nodes=1, local_size=2)
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(rank))
    out = {}
    for hook in ["allreduce"] + SPARSE:
        ddp = DDP(_model(), bucket_cap_mb=0.25)  # one 256 KiB layer per bucket from the second step
        if hook == "allreduce":
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        else:
            register_sparse_hook(ddp, hook, topo, density=1.0, selector="exact", max_inflight_bytes=0)
        for _ in range(3):
            ddp.zero_grad()
            with LiveBytes() as probe:
                ddp(x).square().sum().backward()
        out[hook] = (probe.peak, [p.grad.clone() for p in ddp.parameters()])
    return out


def test_ddp_hook_at_density_1_finishes_buckets_within_its_budget_and_equals_allreduce(runs):
    bucket = 256 * 256 * 4
    for _, res in runs:
        base_peak, base_grads = res["allreduce"]
        model = 6 * bucket
        for name in SPARSE:
            peak, grads = res[name]
            for got, want in zip(grads, base_grads):
                assert_close(got, want, rtol=1e-6, atol=1e-7)
            # a new residual may replace each bucket's old one; one bucket's buffers in flight
            bound = base_peak + model + PAIRS_BOUND[name] * bucket
            assert peak <= bound, f"{name}: {peak / bucket:.1f} buckets (all-reduce hook {base_peak / bucket:.1f})"
