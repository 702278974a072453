"""One rank of ``cachepipe bench comm`` (NOTE [benchmark ranks]): time every algorithm on
every size (median over repetitions of the slowest worker's time, after warm-up); rank 0
reports the rows and the selector's cost per element (for the nominal model)."""
from __future__ import annotations

import statistics
import time

from tools.bench.harness.ranks import run_rank

__all__ = ["time_exchanges"]


def time_exchanges(spec: dict) -> dict:
    import torch
    import torch.distributed as dist

    from comm import Topology, build_exchanger
    from comm.topk import get_selector, k_for

    rank = dist.get_rank()
    topo = Topology(nodes=spec["nodes"], local_size=spec["local_size"], shared_memory=spec["shm"])
    transport = "shm" if topo.shm is not None else "gloo"
    rows, gamma = [], None
    for numel in spec["sizes"]:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
        if rank == 0 and gamma is None:  # selection cost per element, for the nominal model
            t0 = time.perf_counter()
            get_selector(spec["selector"])(x, k_for(numel, spec["density"]))
            gamma = (time.perf_counter() - t0) / numel
        for name in spec["algorithms"]:
            ex = build_exchanger(name, topo, density=spec["density"], selector=spec["selector"],
                                 value_dtype=spec["value_dtype"])
            times = []
            for i in range(spec["warmup"] + spec["reps"]):
                dist.barrier()
                t0 = time.perf_counter()
                ex.exchange(x)
                slowest = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                if i >= spec["warmup"]:
                    times.append(slowest.item())
            sparse = ex.sparse
            del ex
            rows.append(dict(algorithm=name, nodes=spec["nodes"], local_size=spec["local_size"],
                             inter_mbit=spec["inter_mbit"], numel=numel, density=spec["density"] if sparse else None,
                             value_dtype=spec["value_dtype"] or "fp32", selector=spec["selector"] if sparse else "",
                             median_s=statistics.median(times), min_s=min(times), reps=len(times),
                             intra_transport=transport))
            if rank == 0:
                print(f"  {name:8s} numel={numel:>11,d} median {rows[-1]['median_s']:.4f}s", flush=True)
    return {"rows": rows, "gamma": gamma}


if __name__ == "__main__":
    raise SystemExit(run_rank(time_exchanges, group_timeout_min=20))
