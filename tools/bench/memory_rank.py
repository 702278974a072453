"""One rank of ``cachepipe bench memory`` (started by tools/bench/memory.py, one per rank).

Joins a gloo group, builds the model of torch's ``test_is_last_hook`` (``Linear(2, W)``
then ``L`` times ``Linear(W, W)``, no bias; W = 4000, L = 10 is 160M parameters), wraps it
in DDP with one comm hook, runs ``--steps`` forward/backward passes on ``randn(10, 2)`` as
that test does, and writes its peak RSS (``getrusage``), its RSS before the model was built
and, with ``--live-bytes``, the peak bytes of tensors the hook allocated (NOTE [hook
working memory] in tools/bench/memory.py) to ``--out``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import resource
from datetime import timedelta

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__)
    for flag in ("--width", "--layers", "--steps", "--nodes", "--local-size"):
        p.add_argument(flag, type=int, required=True)
    p.add_argument("--hook", required=True, help="allreduce, none, or a comm.ALGORITHMS name")
    p.add_argument("--density", type=float, default=None)
    p.add_argument("--selector", default="mstopk")
    p.add_argument("--limit-gb", type=float, default=0.0, help="RLIMIT_AS of this process (0: none)")
    p.add_argument("--live-bytes", action="store_true")
    p.add_argument("--out", required=True)
    return p


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.limit_gb:
        limit = int(args.limit_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import os

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    import comm
    from tools.bench.live_bytes import LiveBytes
    from trainer.atomic_file import write_atomic

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(minutes=30))
    report = {"rank": dist.get_rank(), "start_rss": _rss_bytes(), "status": "ok"}
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(2, args.width, bias=False),
                              *[nn.Linear(args.width, args.width, bias=False) for _ in range(args.layers)])
        report["grad_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
        ddp = DDP(model)
        if args.hook == "allreduce":
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        elif args.hook != "none":
            topo = comm.Topology(nodes=args.nodes, local_size=args.local_size)
            comm.register_sparse_hook(ddp, args.hook, topo, density=args.density, selector=args.selector)
        probe = LiveBytes() if args.live_bytes else None
        x = torch.randn(10, 2, generator=torch.Generator().manual_seed(int(os.environ["RANK"])))
        for _ in range(args.steps):
            ddp.zero_grad()
            with probe if probe is not None else _nothing():
                ddp(x).sum().backward()
        report["hook_peak"] = None if probe is None else probe.peak
    except (MemoryError, RuntimeError) as e:  # RLIMIT_AS reached: torch raises RuntimeError
        if not isinstance(e, MemoryError) and "alloc" not in str(e).lower():
            raise
        report["status"] = "out of memory"
    finally:
        report["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        write_atomic(args.out, json.dumps(report))
    dist.destroy_process_group()
    return 0 if report["status"] == "ok" else 3


@contextlib.contextmanager
def _nothing():
    yield


if __name__ == "__main__":
    raise SystemExit(main())
