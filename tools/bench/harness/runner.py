"""``cachepipe bench NAME``: parse a benchmark's flags, run it, print and write its result.

The harness's half of NOTE [benchmark registry]: every bad flag is refused with one line
(exit 2) before any work: argparse's own, an empty value, a ``--json`` or ``--plot``
path that cannot be written (NOTE [output paths checked first]), a malformed cluster
flag. Then the benchmark runs; the harness prints its table, its notes and the machine
line, writes the result document (NOTE [benchmark result document]) and draws its figure.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from tools.bench.harness.emulate import add_cluster_flags, emulation_from_args
from tools.bench.harness.jobs import JobFailed
from tools.bench.harness.registry import BENCHMARKS
from tools.cli import HelpFormatter, UsageError, refuse_empty
from tools.writable import add_json_flag, check_writable

__all__ = ["bench_parser", "run_benchmark"]


def bench_parser(name: str) -> tuple[argparse.ArgumentParser, object]:
    """The parser of ``cachepipe bench NAME`` (its own flags and the harness's) and its module."""
    entry = BENCHMARKS[name]
    module = importlib.import_module(entry.module)
    parser = argparse.ArgumentParser(prog=f"cachepipe bench {name}", description=entry.help,
                                     formatter_class=HelpFormatter)
    module.configure(parser)
    out = parser.add_argument_group("output (every benchmark)")
    add_json_flag(out, "the result document (rows, command, machine, date)")
    if entry.plot:
        out.add_argument("--plot", default=None, metavar="PATH", help="draw the benchmark's figure (PNG) to PATH")
    if entry.cluster is not None:
        add_cluster_flags(parser, entry.cluster)
    return parser, module


def run_benchmark(name: str, argv: Sequence[str], command: Sequence[str]) -> int:
    """Run ``cachepipe bench NAME ARGV``; ``command`` is the whole command line (for the
    result document). Returns the exit status."""
    from tools.bench.harness.output import document, format_table, write_document
    from tools.bench.harness.machine import machine_line

    entry = BENCHMARKS[name]
    parser, module = bench_parser(name)
    args = parser.parse_args(list(argv))  # exits 2 with one line for a flag it does not take
    args.command_line = list(command)
    try:
        refuse_empty(parser, args)
        check_writable(args.json, "--json")
        check_writable(getattr(args, "plot", None), "--plot")
        args.emulation = emulation_from_args(args, entry.cluster) if entry.cluster is not None else None
        result = module.run(args)
    except UsageError as exc:
        print(f"cachepipe bench {name}: error: {exc}", file=sys.stderr)
        return 2
    except JobFailed as exc:
        print(f"cachepipe bench {name}: error: {exc}", file=sys.stderr)
        return 1
    print(format_table(result.rows, result.columns))
    for title, rows, columns in result.tables:
        print(f"\n{title}\n{format_table(rows, columns)}")
    for note in result.notes:
        print(note)
    print(f"machine: {machine_line()}")
    if args.json:
        write_document(args.json, document(name, command, result))
    if getattr(args, "plot", None) and result.figure is not None:
        result.figure(Path(args.plot))
    return result.exit
