"""``cachepipe bench omgs``: OMGS merged-layer planning vs TopK-SGD, LAGS and fixed fusion.

1. Measures ResNet-50's per-layer backward times on this CPU (one process, real model).
2. Compares the paper's greedy planner with the optimal one on random layer profiles.
3. On an emulated cluster (2 nodes x 2 workers, ``--rate-mbit`` between nodes; NOTE
   [emulated cluster]) every rank replays the measured backward (NOTE [emulated backward]),
   fits alpha, beta, gamma in place, plans, and times each mode with the real pipelined
   exchanger; the table puts each measured iteration time next to the model's prediction.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["configure", "main", "greedy_vs_optimal"]

_ROOT = Path(__file__).resolve().parents[2]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=2, choices=[1, 2], help="emulated nodes")
    parser.add_argument("--workers-per-node", type=int, default=2, help="worker processes per node")
    parser.add_argument("--rate-mbit", type=float, default=200.0, help="inter-node bandwidth, Mbit/s")
    parser.add_argument("--no-netns", action="store_true", help="run all workers on loopback (no rate limit)")
    parser.add_argument("--density", type=float, default=0.001, help="fraction of gradients sent (rho)")
    parser.add_argument("--selector", default="exact", help="top-k selector (comm.topk.SELECTORS)")
    parser.add_argument("--batch", type=int, default=2, help="ResNet-50 batch for the backward profile")
    parser.add_argument("--resolution", type=int, default=112, help="image side for the backward profile")
    parser.add_argument("--profile-repeats", type=int, default=3, help="timed backward passes per profile")
    parser.add_argument("--fit-repeats", type=int, default=3, help="repeats per point of the cost fits")
    parser.add_argument("--fusion-mb", type=float, default=4.0, help="fixed-fusion threshold (dense MiB)")
    parser.add_argument("--iters", type=int, default=6, help="timed iterations per mode")
    parser.add_argument("--warmup", type=int, default=2, help="untimed iterations per mode")
    parser.add_argument("--random-profiles", type=int, default=200, help="random profiles for greedy vs optimal")
    parser.add_argument("--json", default=None, help="write rows (and the fitted model) to this JSON file")


def greedy_vs_optimal(count: int, seed: int = 0) -> dict:
    """Ratio of the paper plan's modelled time to the optimum on random profiles."""
    from comm.omgs import find_merged_layers, predict_iteration_time

    rng, ratios = random.Random(seed), []
    for _ in range(count):
        n = rng.randint(20, 200)
        tb = [rng.uniform(0, 5e-3) for _ in range(n)]
        d = [rng.choice([rng.randint(64, 4096), rng.randint(4096, 2_500_000)]) for _ in range(n)]
        c = dict(alpha=10 ** rng.uniform(-4.5, -2), beta=10 ** rng.uniform(-9.5, -7),
                 gamma=10 ** rng.uniform(-9, -7), rho=rng.choice([0.001, 0.01]))
        t = [predict_iteration_time(tb, d, find_merged_layers(tb, d, **c, method=m), **c)
             for m in ("paper", "optimal")]
        ratios.append(t[0] / t[1])
    ratios.sort()
    return dict(profiles=count, mean=statistics.fmean(ratios), median=statistics.median(ratios),
                p90=ratios[int(0.9 * (count - 1))], max=ratios[-1],
                share_worse_1pct=sum(r > 1.01 for r in ratios) / count)


def _resnet_profile(args) -> tuple[list[float], list[int]]:
    import torch

    from comm.omgs import measure_backward_times
    from tools.omgs.resnet50 import resnet50

    torch.manual_seed(0)
    model = resnet50()
    x = torch.randn(args.batch, 3, args.resolution, args.resolution)
    y = torch.randint(0, 1000, (args.batch,))
    prof = measure_backward_times(model, lambda: torch.nn.functional.cross_entropy(model(x), y),
                                  repeats=args.profile_repeats)
    return prof.tb, prof.d


def _launch(spec: dict, args, tmp: Path) -> tuple[dict, str]:
    from tests.redis_servers import free_port  # a free TCP port, shared helper

    world = args.nodes * args.workers_per_node
    spec_path, out_path = tmp / "spec.json", tmp / "result.json"
    spec_path.write_text(json.dumps(spec))
    base = dict(os.environ, PYTHONPATH=str(_ROOT), WORLD_SIZE=str(world), MASTER_PORT=str(free_port()),
                OMP_NUM_THREADS="1", MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_=str(2**40))
    # NOTE [bench allocator]: with glibc's defaults every large tensor is a fresh mmap
    # whose pages fault in on first touch, a cost a GPU caching allocator does not have;
    # keeping freed memory in the heap makes repeated large buffers cheap for every mode.
    argv = [sys.executable, "-m", "tools.omgs.worker", str(spec_path), str(out_path)]

    def start(cluster):
        procs = []
        for rank in range(world):
            node = rank // args.workers_per_node
            env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank % args.workers_per_node))
            if cluster is None:
                env["MASTER_ADDR"] = "127.0.0.1"
                cmd = argv
            else:
                env.update(cluster.env(node))
                cmd = cluster.command(node, argv)
            procs.append(subprocess.Popen(cmd, env=env, cwd=_ROOT))
        codes = [p.wait(timeout=1800) for p in procs]
        if any(codes):
            raise RuntimeError(f"benchmark workers failed with exit codes {codes}")
        return json.loads(out_path.read_text())

    from tools.omgs.netns import EmulatedCluster, netns_available

    if args.no_netns or args.nodes == 1 or not netns_available():
        why = "requested" if args.no_netns or args.nodes == 1 else "needs root + iproute2"
        return start(None), f"loopback gloo, {world} workers, no rate limit ({why})"
    with EmulatedCluster(rate_mbit=args.rate_mbit) as cluster:
        return start(cluster), (f"netns cluster: {args.nodes} nodes x {args.workers_per_node} workers, "
                                f"{args.rate_mbit:g} Mbit/s tbf between nodes")


def main(args: argparse.Namespace) -> int:
    from comm.omgs import predict_iteration_time
    from tools.bench.table import format_table, machine_description, write_json

    print(f"measuring ResNet-50 backward (batch {args.batch}, {args.resolution}px) ...", flush=True)
    tb, d = _resnet_profile(args)
    print(f"  {len(d)} tensors, {sum(d):,} parameters, backward {1e3 * sum(tb):.1f} ms", flush=True)
    gvo = greedy_vs_optimal(args.random_profiles)
    print("paper (greedy) / optimal modelled time on {profiles} random profiles: mean {mean:.3f}, "
          "median {median:.3f}, p90 {p90:.3f}, max {max:.3f}, >1% worse in {share_worse_1pct:.0%}".format(**gvo))
    spec = dict(tb=tb, d=d, density=args.density, selector=args.selector, fusion_mb=args.fusion_mb,
                iters=args.iters, warmup=args.warmup, profile_repeats=args.profile_repeats,
                fit_repeats=args.fit_repeats)
    with tempfile.TemporaryDirectory(prefix="omgs-bench-") as tmp:
        result, where = _launch(spec, args, Path(tmp))
    rows, c = result["rows"], result["coeffs"]
    lags = next(r["measured_ms"] for r in rows if r["mode"].startswith("lags"))
    fastest = min(r["measured_ms"] for r in rows if r["groups"])
    for r in rows:
        r["vs_lags"] = lags / r["measured_ms"] if r["groups"] else ""
        r["meas/pred"] = r["measured_ms"] / r["predicted_ms"]
    print(f"\n{where}; density {args.density}, selector {args.selector}")
    print(f"fitted: alpha {1e3 * c['alpha']:.3f} ms, beta {1e9 * c['beta']:.3f} ns/B "
          f"({8e-6 / max(c['beta'], 1e-15):.1f} Mbit/s per-worker payload), gamma {c['gamma']:.3e}, "
          f"decompression tu {1e3 * result['tu']:.1f} ms")
    print(format_table(rows, ["mode", "groups", "measured_ms", "min_ms", "max_ms", "predicted_ms",
                              "meas/pred", "vs_lags", "compress_ms", "wait_ms", "sync_ms"]))
    opt = next(r for r in rows if r["mode"] == "omgs optimal")
    t_res = [predict_iteration_time(result["tb_effective"], d, result["plans"][f"omgs {m}"], **c, tu=result["tu"])
             for m in ("paper", "optimal")]
    print(f"on this ResNet-50 profile the paper plan's modelled time is {t_res[0] / t_res[1]:.3f}x the optimum's")
    targets = {
        "optimal fastest or within 5%": opt["measured_ms"] <= 1.05 * fastest,
        ">= 1.2x faster than LAGS": lags / opt["measured_ms"] >= 1.2,
        "measured within 25% of prediction": abs(opt["meas/pred"] - 1) <= 0.25,
    }
    for name, ok in targets.items():
        print(f"  target {name}: {'met' if ok else 'NOT met'}")
    print(f"machine: {machine_description()}")
    if args.json:
        write_json(args.json, [dict(r, setup=where, machine=machine_description(), **{f"fit_{k}": v for k, v in c.items()})
                               for r in rows] + [dict(mode="greedy_vs_optimal_random", **gvo),
                                                 dict(mode="greedy_vs_optimal_resnet50", ratio=t_res[0] / t_res[1])])
    return 0
