"""``cachepipe report RUN_DIR [RUN_DIR ...]``: plot training curves and time breakdowns."""
from __future__ import annotations

import argparse
import sys

__all__ = ["configure", "main"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (each with metrics.jsonl)")
    parser.add_argument("--out", default=None, help="where to write the PNGs and summary.md (default: the first RUN_DIR/report)")


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tools.cli import UsageError
    from tools.writable import check_writable
    from trainer.report import write_report

    out = args.out or str(Path(args.runs[0]) / "report")
    check_writable(out, "--out", directory=True)  # NOTE [output paths checked first]
    try:
        paths = write_report(args.runs, out)
    except ValueError as exc:  # a RUN_DIR without metrics: a bad argument
        print(f"cachepipe report: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the folder failed after the check (full, removed)
        raise UsageError(f"--out {out}: cannot write the report ({exc.strerror or exc})") from None
    for p in paths:
        print(p)
    print((Path(out) / "summary.md").read_text())
    return 0
