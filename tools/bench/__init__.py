"""``cachepipe bench NAME``: benchmarks that measure a thing against its baseline side by side.

Each benchmark is a module here with ``configure(parser)`` and ``main(args) -> int``; it
prints a table and, with ``--json PATH``, writes a list of row dicts. Timing targets live
in the benchmarks and ``docs/BENCHMARKS.md``, never in tests.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from tools.cli import HelpFormatter, UsageError, refuse_empty
from tools.writable import check_writable

__all__ = ["BENCHMARKS", "configure", "main"]

# name -> (module, one-line help)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "cache": ("tools.bench.cache", "source vs L1 vs L2 read throughput"),
    "loader": ("tools.bench.loader", "plain DataLoader vs cached_dataloader vs DALI"),
    "l2": ("tools.bench.l2", "Redis CPU per GB served: one server vs several vs io-threads"),
    "topk": ("tools.bench.topk", "top-k selectors: time, recall, captured energy"),
    "comm": ("tools.bench.comm", "gradient exchange algorithms on an emulated cluster"),
    "overlap": ("tools.bench.overlap", "a sparse step with and without overlap vs max(compute, exchange)"),
    "omgs": ("tools.bench.omgs", "OMGS merged-layer planning vs LAGS / TopK-SGD / fusion"),
    "feed": ("tools.bench.feed", "CPU per image of each serial stage of feeding a GPU (the CPU proxy)"),
    "train": ("tools.bench.train", "training throughput: synthetic vs cached loaders"),
    "memory": ("tools.bench.memory", "peak memory per process of the sparse DDP hook vs torch's all-reduce hook"),
    "faults": ("tools.bench.faults", "the demo trained while faults are injected vs a fault-free run"),
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = "benchmarks:\n" + "\n".join(f"  {n:<8} {h}" for n, (_, h) in BENCHMARKS.items())
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("bench", nargs="?", choices=sorted(BENCHMARKS), metavar="NAME",
                        help="which benchmark (below)")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="that benchmark's flags (NAME --help)")
    parser.set_defaults(print_help=parser.print_help)


def main(args: argparse.Namespace) -> int:
    """Parse the chosen benchmark's own flags and run it (only that module is imported);
    without a NAME print the list of benchmarks (as ``--help``) and return 2."""
    if args.bench is None:
        args.print_help()
        return 2
    module_name, help_text = BENCHMARKS[args.bench]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"cachepipe bench {args.bench}", description=help_text,
                                     formatter_class=HelpFormatter)
    module.configure(parser)
    bench_args = parser.parse_args(args.bench_args)
    try:
        refuse_empty(parser, bench_args)
        check_writable(getattr(bench_args, "json", None), "--json")  # NOTE [output paths checked first]
    except UsageError as exc:
        print(f"cachepipe bench {args.bench}: error: {exc}", file=sys.stderr)
        return 2
    return int(module.main(bench_args) or 0)
