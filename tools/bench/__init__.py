"""``cachepipe bench NAME``: benchmarks that measure a thing against its baseline side by side.

Each benchmark is one module here (``configure(parser)``, ``run(args) -> Result``) and one
:func:`register_benchmark` line below (NOTE [benchmark registry] in
``tools/bench/harness/registry.py``); what they share is ``tools/bench/harness/``, their
rank entry points ``tools/bench/ranks/``, pieces of one benchmark too large for its module
``tools/bench/parts/``. ``cachepipe bench render`` redraws the benchmark pages
(``docs/benchmarks/``) from their result documents. Timing targets live in the benchmarks
and their pages, never in tests.
"""
from __future__ import annotations

import argparse
import sys

from tools.bench.harness.emulate import ClusterFlags
from tools.bench.harness.registry import BENCHMARKS, register_benchmark

__all__ = ["BENCHMARKS", "configure", "main", "register_benchmark"]

RENDER = "render"  # not a benchmark: redraws docs/benchmarks/ from docs/benchmarks/results/

register_benchmark("cache", "tools.bench.cache", "source vs L1 vs L2 read throughput")
register_benchmark("loader", "tools.bench.loader", "plain DataLoader vs cached_dataloader vs DALI; --emulate: "
                   "node-local vs global sampling", cluster=ClusterFlags(default=None, rate=200.0))
register_benchmark("l2", "tools.bench.l2", "L2 read CPU per sample and GB: Redis servers (several, io-threads, "
                   "embedded) vs shm://")
register_benchmark("feed", "tools.bench.feed", "CPU per image of each serial stage of feeding a GPU (the CPU proxy)")
register_benchmark("topk", "tools.bench.topk", "top-k selectors: time, recall, captured energy", plot=True)
register_benchmark("comm", "tools.bench.comm", "gradient exchange algorithms on an emulated cluster vs the cost model",
                   cluster=ClusterFlags(default="2x2@200", rate=200.0, timeout=3600.0, loopback=True), plot=True)
register_benchmark("overlap", "tools.bench.overlap", "a sparse step with and without overlap vs max(compute, exchange)",
                   cluster=ClusterFlags(default="2x2@4", rate=4.0))
register_benchmark("omgs", "tools.bench.omgs", "OMGS merged-layer planning vs LAGS / TopK-SGD / fusion",
                   cluster=ClusterFlags(default="2x2@200", rate=200.0, burst_kib=32, loopback=True))
register_benchmark("train", "tools.bench.train", "training throughput: synthetic vs cached loaders; --convergence: "
                   "accuracy per epoch; --emulate: time to accuracy on an emulated cluster",
                   cluster=ClusterFlags(default=None, rate=4.0), plot=True)
register_benchmark("memory", "tools.bench.memory", "peak memory per process of the sparse DDP hook vs torch's "
                   "all-reduce hook", cluster=ClusterFlags(default="1x2", rate=None))
register_benchmark("faults", "tools.bench.faults", "the demo trained while faults are injected vs a fault-free run")
register_benchmark("io", "tools.bench.io", "no cache vs L1 vs L1 + L2 with the source on an emulated NFS share "
                   "(slowfs): I/O per image and images/s (the seed's Fig. 9)")
register_benchmark("source", "tools.bench.source", "the source on an emulated NFS share: scan of 100k files, warm-up "
                   "bandwidth, two nodes' reads, a chmod -R (issue 44)")
register_benchmark("scale", "tools.bench.scale", "every per-N cost at 10k, 100k, 1.28M files (scan, stats, warm-up, "
                   "loader start, workers' memory) and its growth exponent")


def configure(parser: argparse.ArgumentParser) -> None:
    width = max(map(len, BENCHMARKS)) + 2
    parser.epilog = ("benchmarks:\n" + "\n".join(f"  {n:<{width}} {b.help}" for n, b in BENCHMARKS.items())
                     + f"\n\n  {RENDER:<{width}} redraw docs/benchmarks/ from its result documents (--check: "
                       "only compare)")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("bench", nargs="?", choices=sorted([*BENCHMARKS, RENDER]), metavar="NAME",
                        help="which benchmark (below)")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="that benchmark's flags (NAME --help)")
    parser.set_defaults(print_help=parser.print_help)


def main(args: argparse.Namespace) -> int:
    """Run the chosen benchmark (only its module is imported); without a NAME print the
    list of benchmarks (as ``--help``) and return 2."""
    if args.bench is None:
        args.print_help()
        return 2
    if args.bench == RENDER:
        from tools.bench.harness.render import render_main

        return render_main(args.bench_args, BENCHMARKS)
    from tools.bench.harness.runner import run_benchmark

    return run_benchmark(args.bench, args.bench_args, getattr(args, "command_line", ["cachepipe", "bench",
                                                                                     args.bench, *args.bench_args]))
