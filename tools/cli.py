"""Entry point of the ``cachepipe`` command.

Each subcommand lives in its own module that defines ``configure(parser)`` (adds its
flags) and ``main(args) -> int``. Only the chosen module is imported, so
``cachepipe warmup`` never pays for importing torch. Exit status 2 means a bad flag:
argparse's own checks, or a ``UsageError`` raised by ``main``.
"""
from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["COMMANDS", "HelpFormatter", "UsageError", "main", "refuse_empty"]

# name -> (module, one-line help). Adding a subcommand is one entry and one module.
COMMANDS: dict[str, tuple[str, str]] = {
    "make-dataset": ("tools.make_dataset", "write a small learnable ImageNet-layout JPEG dataset"),
    "warmup": ("tools.warmup", "fill the two-level cache (L1 LMDB mirror, L2 Redis) from a source tree"),
    "stats": ("tools.stats", "show cache coverage per level"),
    "drop": ("tools.drop", "free the L2 keys and cache dir entries of older versions of a source"),
    "server": ("tools.server", "start, stop or inspect the embedded Redis server"),
    "bench": ("tools.bench", "run a benchmark (cachepipe bench --help lists them) or redraw the benchmark pages"),
    "train": ("tools.train", "train an image model end to end from the cache"),
    "report": ("tools.report", "plot training curves and time breakdowns of runs"),
    "plan": ("tools.plan", "price a cluster on paper: step time, throughput, a recipe's run and the cache it needs"),
    "slowfs": ("tools.slowfs", "serve a directory read-only through FUSE as a slow network file share (latency, "
               "bandwidth)"),
    "doctor": ("tools.doctor", "check redis-server, /dev/shm, DALI, CUDA, NCCL, triton; --gpu runs the GPU checks"),
}


class UsageError(ValueError):
    """A bad flag value found after parsing: ``main`` prints it as one line and exits 2,
    as argparse does for the flags it checks itself."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to a flag's help unless the help already states it or X is unset."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text.lower():
            return text
        return super()._get_help_string(action)


def refuse_empty(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse a flag or argument given as ``''``: as a path it would silently mean the
    current directory (``--cache-dir ''``, ``make-dataset ''``), elsewhere a default.

    Raises:
        UsageError: names the first such flag or argument.
    """
    for action in parser._actions:
        if action.nargs == argparse.REMAINDER:  # parsed again by the subcommand
            continue
        value = getattr(args, action.dest, None)
        if value == "" or (isinstance(value, list) and "" in value):
            name = max(action.option_strings, key=len) if action.option_strings else (action.metavar or action.dest)
            raise UsageError(f"{name} '': empty; give a value (an empty path would silently mean the current "
                             f"directory)")


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cachepipe",
        description="Two-level image cache, cached loaders and sparse gradient exchange.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + "\n".join(f"  {n:<13} {h}" for n, (_, h) in COMMANDS.items()),
    )
    parser.add_argument("command", choices=sorted(COMMANDS), metavar="COMMAND", help="see below")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``cachepipe COMMAND [ARGS]``; returns the process exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        _top_parser().print_help()
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        _top_parser().parse_args([name])  # prints the valid names and exits 2
    module_name, help_text = COMMANDS[name]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(
        prog=f"cachepipe {name}",
        description=help_text,
        formatter_class=HelpFormatter,
    )
    module.configure(parser)
    args = parser.parse_args(rest)
    args.command_line = ["cachepipe", name, *rest]  # to print a command that continues this one
    try:
        refuse_empty(parser, args)
        return int(module.main(args) or 0)
    except UsageError as exc:
        print(f"cachepipe {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C, or trainer.launch.Stopped (with the signal it names)
        signum = getattr(exc, "signum", 2)
        print(f"cachepipe {name}: {exc if hasattr(exc, 'signum') else 'interrupted'}", file=sys.stderr)
        return 128 + signum
