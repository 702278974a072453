"""Small statistics the benchmarks share: the median run of interleaved rounds."""
from __future__ import annotations

from collections.abc import Sequence

__all__ = ["median_run", "median_ratio"]


def median_run(runs: Sequence[dict], key: str) -> dict:
    """The run whose ``key`` is the median (the upper one of an even count): a whole run,
    so that its other fields stay consistent with it."""
    if not runs:
        raise ValueError("no runs")
    return sorted(runs, key=lambda r: r[key])[len(runs) // 2]


def median_ratio(runs: Sequence[dict], bases: Sequence[dict], key: str) -> float:
    """The median over rounds of ``run[key] / base[key]``, each ratio taken within one round
    (same load), as interleaved rounds should be compared."""
    ratios = sorted(r[key] / b[key] for r, b in zip(runs, bases))
    return ratios[len(ratios) // 2]
