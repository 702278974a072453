"""``cachepipe bench train``: three benchmarks of training behind one command.

- default: training images/s with synthetic data vs the cached loaders
  (``tools.bench.parts.train_throughput``);
- ``--convergence DIR``: accuracy per epoch of exchange algorithms and ablation variants
  on any recipe and data (``tools.bench.parts.train_convergence``);
- ``--emulate MxN[@MBIT]``: time to accuracy of exchange algorithms on an emulated slow
  cluster (``tools.bench.parts.train_emulated``).

This module holds the flags they share and picks the mode.
"""
from __future__ import annotations

import argparse

from tools.bench.harness import Result
from tools.bench.harness.workload import DEFAULTS
from tools.bench.parts import train_convergence, train_emulated, train_throughput

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default=None, help="ImageFolder root with train/ (default: a generated demo dataset)")
    parser.add_argument("--model", default=None, help="model name (default: resnet50 on GPU, resnet_small on CPU)")
    parser.add_argument("--size", type=int, default=None, help="crop size in px (default: 224 on GPU, 56 on CPU)")
    parser.add_argument("--cache-size", type=int, default=None, help="cached shorter side (default: 256 on GPU, 64 on CPU)")
    parser.add_argument("--batch-size", type=int, default=None, help="batch size (default: 128 on GPU, 32 on CPU)")
    train_throughput.configure(parser.add_argument_group("training throughput (without --convergence or --emulate)"))
    shared = parser.add_argument_group("--convergence and --emulate")
    shared.add_argument("--comm", default=None,
                        help="comma-separated exchange algorithms: dense, hier, 2dtar, topk_ag, gtopk, hitopk, omgs, "
                             f"powersgd (default: {train_convergence.DEFAULT_COMMS} with --convergence, "
                             f"{DEFAULTS['comm']} with --emulate)")
    shared.add_argument("--recipe", default=None, help="training recipe, shipped name or .yaml path (default: demo)")
    shared.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="recipe override for every run, as cachepipe train --set (repeatable; default: none)")
    shared.add_argument("--density", type=float, default=None,
                        help="density of the sparse algorithms (default: each algorithm's own, 0.01; gtopk 0.02)")
    shared.add_argument("--epochs", type=int, default=None,
                        help="epochs of every phase (default: the recipe's; with --emulate NOTE [emulate defaults])")
    from tools.bench.harness.slow_source import add_source_flags

    add_source_flags(parser)  # the throughput mode and --emulate read their data through slowfs
    train_convergence.configure(parser.add_argument_group("convergence comparison (instead of throughput)"))
    train_emulated.configure(parser.add_argument_group(
        "time to accuracy on an emulated cluster (with --emulate; --data, --model, --size, --cache-size, "
        "--batch-size, --epochs, --density, --comm, --recipe and --set apply too)"))


def run(args: argparse.Namespace) -> Result:
    if args.convergence:
        return train_convergence.run(args)
    if args.emulation is not None:
        return train_emulated.run(args)
    return train_throughput.run(args)
