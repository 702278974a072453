"""One worker of ``cachepipe bench comm`` (started by tools/bench/comm.py, one per rank).

Joins a gloo group, times every algorithm on every size (median over repetitions of the
slowest worker's time, after warm-up) and, on rank 0, writes the rows as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import timedelta

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__)
    for flag in ("--rank", "--world", "--nodes", "--local-size", "--master-port", "--reps", "--warmup"):
        p.add_argument(flag, type=int, required=True)
    p.add_argument("--master-addr", required=True)
    p.add_argument("--iface", required=True)
    p.add_argument("--sizes", type=int, nargs="+", required=True)
    p.add_argument("--density", type=float, required=True)
    p.add_argument("--algorithms", nargs="+", required=True)
    p.add_argument("--selector", required=True)
    p.add_argument("--value-dtype", default=None)
    p.add_argument("--inter-mbit", type=float, default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--no-shm", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    os.environ["GLOO_SOCKET_IFNAME"] = args.iface
    import torch
    import torch.distributed as dist

    from comm import Topology, build_exchanger
    from comm.topk import get_selector, k_for
    from trainer.atomic_file import write_atomic

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master_addr}:{args.master_port}",
                            rank=args.rank, world_size=args.world, timeout=timedelta(minutes=20))
    try:
        topo = Topology(nodes=args.nodes, local_size=args.local_size, shared_memory=not args.no_shm)
        transport = "shm" if topo.shm is not None else "gloo"
        rows, gamma = [], None
        for numel in args.sizes:
            x = torch.randn(numel, generator=torch.Generator().manual_seed(args.rank))
            if args.rank == 0 and gamma is None:  # selection cost per element, for the nominal model
                t0 = time.perf_counter()
                get_selector(args.selector)(x, k_for(numel, args.density))
                gamma = (time.perf_counter() - t0) / numel
            for name in args.algorithms:
                ex = build_exchanger(name, topo, density=args.density, selector=args.selector,
                                     value_dtype=args.value_dtype)
                times = []
                for i in range(args.warmup + args.reps):
                    dist.barrier()
                    t0 = time.perf_counter()
                    ex.exchange(x)
                    slowest = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                    if i >= args.warmup:
                        times.append(slowest.item())
                sparse = ex.sparse
                del ex
                rows.append(dict(algorithm=name, nodes=args.nodes, local_size=args.local_size,
                                 inter_mbit=args.inter_mbit, numel=numel, density=args.density if sparse else None,
                                 value_dtype=args.value_dtype or "fp32", selector=args.selector if sparse else "",
                                 median_s=statistics.median(times), min_s=min(times), reps=len(times),
                                 intra_transport=transport))
                if args.rank == 0:
                    print(f"  {name:8s} numel={numel:>11,d} median {rows[-1]['median_s']:.4f}s", flush=True)
        if args.rank == 0:
            write_atomic(args.out, json.dumps({"rows": rows, "gamma": gamma}))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
