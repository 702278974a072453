"""One rank of ``cachepipe bench memory`` (NOTE [benchmark ranks]; a process of its own, not forked).

Builds the model of torch's ``test_is_last_hook`` (``Linear(2, W)`` then ``L`` times
``Linear(W, W)``, no bias; W = 4000, L = 10 is 160M parameters), wraps it in DDP with one
comm hook, runs ``steps`` forward/backward passes on ``randn(10, 2)`` as that test does,
and reports its peak RSS (``getrusage``), its RSS before the model was built and, with
``live_bytes``, the peak bytes of tensors the hook allocated (NOTE [hook working memory]
in tools/bench/memory.py). Its address space is limited to ``limit_gb`` before torch
loads: an exchange that needs more reports "out of memory" instead of waking the OOM killer.
"""
from __future__ import annotations

import contextlib
import os
import resource

from tools.bench.harness.ranks import run_rank

__all__ = ["measure_hook"]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _limit(spec: dict) -> None:
    if spec["limit_gb"]:
        limit = int(spec["limit_gb"] * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def measure_hook(spec: dict) -> dict:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    import comm
    from tools.bench.harness.live_bytes import LiveBytes

    width, layers = spec["width"], spec["layers"]
    report = {"rank": dist.get_rank(), "start_rss": _rss_bytes(), "status": "ok"}
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(2, width, bias=False),
                              *[nn.Linear(width, width, bias=False) for _ in range(layers)])
        report["grad_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
        ddp = DDP(model)
        if spec["hook"] == "allreduce":
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        elif spec["hook"] != "none":
            topo = comm.Topology(nodes=spec["nodes"], local_size=spec["local_size"])
            comm.register_sparse_hook(ddp, spec["hook"], topo, density=spec["density"], selector=spec["selector"])
        probe = LiveBytes() if spec["live_bytes"] else None
        x = torch.randn(10, 2, generator=torch.Generator().manual_seed(int(os.environ["RANK"])))
        for _ in range(spec["steps"]):
            ddp.zero_grad()
            with probe if probe is not None else contextlib.nullcontext():
                ddp(x).sum().backward()
        report["hook_peak"] = None if probe is None else probe.peak
    except (MemoryError, RuntimeError) as e:  # RLIMIT_AS reached: torch raises RuntimeError
        if not isinstance(e, MemoryError) and "alloc" not in str(e).lower():
            raise
        report["status"] = "out of memory"
    report["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return report


if __name__ == "__main__":
    raise SystemExit(run_rank(measure_hook, per_rank=True, setup=_limit))
