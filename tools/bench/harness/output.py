"""A benchmark's output: the printed table and the JSON result document.

NOTE [benchmark result document]: ``--json PATH`` writes one object, the same that
``docs/benchmarks/results/NAME.json`` keeps and ``cachepipe bench render`` draws a page's
table from: ``benchmark`` (its name), ``command`` (the command line that made it),
``date`` (UTC, ISO 8601), ``machine`` (one line) and ``machine_info`` (its fields:
``tools.bench.harness.machine``), ``columns`` (the printed table's), ``notes`` (the lines
under the table), ``headline``, ``rows`` (every measured field of every case) and
``tables`` (a benchmark's further tables, each ``title``, ``columns``, ``rows``). A document
made from a run recorded before this format (``docs/benchmarks/results/``) adds ``source``
(where and when it was recorded) and, when ``machine_info`` has no commit, ``commit`` (as
recorded); a page that draws several runs in one table names each by its ``label``. Older
releases wrote the bare list of rows; :func:`read_rows` reads both.
"""
from __future__ import annotations

import datetime
import json
import os
from collections.abc import Sequence

from tools.bench.harness.machine import machine, machine_line
from tools.bench.harness.result import Result
from tools.writable import write_output

__all__ = ["cell", "document", "format_table", "read_rows", "write_document"]


def cell(v: object) -> str:
    """A table cell: floats to 4 significant digits, lists and dicts compactly."""
    if isinstance(v, bool) or v is None:
        return "" if v is None else str(v)
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"
    return str(v)


def format_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """``rows`` as a Markdown table restricted to ``columns``."""
    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(list(columns)), sep] + [line(r) for r in cells])


def document(name: str, command: Sequence[str], result: Result) -> dict:
    """The result document of NOTE [benchmark result document]."""
    return {"benchmark": name, "command": " ".join(command),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "machine": machine_line(), "machine_info": machine(), "columns": list(result.columns),
            "notes": list(result.notes), "headline": result.headline, "rows": result.rows,
            "tables": [{"title": t, "columns": list(c), "rows": r} for t, r, c in result.tables]}


def write_document(path: str | os.PathLike, doc: dict) -> None:
    """Write ``doc`` as JSON atomically (NOTE [atomic files]).

    Raises:
        UsageError: it cannot be written (``--json``; NOTE [output paths checked first]).
    """
    write_output(path, json.dumps(doc, indent=1, default=str) + "\n", "--json")


def read_rows(path: str | os.PathLike) -> list[dict]:
    """The rows of a benchmark's JSON: a result document, or the bare list older releases wrote."""
    with open(path) as f:
        data = json.load(f)
    return data["rows"] if isinstance(data, dict) else data
