"""What a benchmark returns to the harness: its rows, and how to show them."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Result"]


@dataclass
class Result:
    """A benchmark's result; the harness prints it and writes it (``tools.bench.harness.runner``).

    Attributes:
        rows: one dict per measured case (what ``--json`` keeps: every field, not only the
            table's).
        columns: the fields shown in the printed table, in order.
        notes: lines printed under the table (the set-up: link rate, L2, dataset ...).
        headline: the figure the benchmark exists for, in a few words (``"L2 4.4x source
            decode at 4 workers"``), shown in ``docs/benchmarks/README.md``.
        figure: draws the ``--plot`` PNG at the path it is given (benchmarks with a figure).
        tables: more tables as ``(title, rows, columns)``, printed after the main one.
        exit: the exit status (0; e.g. 1 when a target the benchmark checks was missed
            and it was asked to fail then).
    """

    rows: list[dict]
    columns: Sequence[str]
    notes: Sequence[str] = ()
    headline: str | None = None
    figure: Callable[[Path], None] | None = None
    tables: Sequence[tuple[str, list[dict], Sequence[str]]] = field(default_factory=list)
    exit: int = 0
