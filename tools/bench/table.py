"""Shared output for benchmarks: an aligned text table and a JSON list of rows."""
from __future__ import annotations

import json
import os
import platform
from collections.abc import Sequence

from tools.writable import write_output

__all__ = ["format_table", "write_json", "machine_description"]


def _cell(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"
    return str(v)


def format_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """Render ``rows`` as a Markdown table restricted to ``columns``."""
    cells = [[_cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(list(columns)), sep] + [line(r) for r in cells])


def write_json(path: str | os.PathLike, rows: Sequence[dict]) -> None:
    """Write ``rows`` (a list of dicts) as JSON atomically (NOTE [atomic files]).

    Raises:
        UsageError: it cannot be written (``--json``; NOTE [output paths checked first]).
    """
    write_output(path, json.dumps(list(rows), indent=1), "--json")


def machine_description() -> str:
    """One line naming the machine a benchmark ran on (for docs/BENCHMARKS.md)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, {platform.system()} {platform.release()}"
