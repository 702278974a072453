"""Convergence comparison of gradient-exchange algorithms: accuracy per epoch, same seed and data.

Trains each named recipe in turn on 4 local processes as 2 nodes x 2 (gloo), keeps each
run's directory and draws them together with ``trainer.report``. Used by
``cachepipe bench train --convergence DIR`` (``tools.bench.parts.train_convergence`` builds
the runs from its flags).

Example:
    >>> from trainer.recipes import load_recipe, override
    >>> base = load_recipe("cifar10")
    >>> runs = [ConvergenceRun(c, override(base, comm=c)) for c in names(per_bucket=True)]
    >>> rows = compare_convergence("runs/conv", runs, "/tmp/cifar10")  # doctest: +SKIP
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainer.config import Recipe

__all__ = ["ConvergenceRun", "add_dense_reference", "compare_convergence", "summarize"]


@dataclass(frozen=True)
class ConvergenceRun:
    """One row of a comparison: its ``name`` (also its directory under the output) and the
    whole ``recipe`` it trains."""

    name: str
    recipe: Recipe


def summarize(run: ConvergenceRun, metrics: Sequence[dict], seconds: float) -> dict:
    """One summary row from a run's per-epoch metrics rows.

    ``inter_node_bytes`` is the sum of the epochs' ``inter_node_bytes`` (None when the
    metrics do not record it); ``top1`` is the validation top-1 after each epoch.
    """
    phase = run.recipe.phases[-1]
    recorded = [m.get("inter_node_bytes") for m in metrics]
    return {"name": run.name, "comm": phase.comm, "density": metrics[-1]["density"], "epochs": len(metrics),
            "final_top1": metrics[-1]["val_top1"], "best_top1": max(m["val_top1"] for m in metrics),
            "final_top5": metrics[-1]["val_top5"], "final_loss": metrics[-1]["train_loss"],
            "inter_node_bytes": sum(recorded) if None not in recorded else None, "seconds": seconds,
            "top1": [m["val_top1"] for m in metrics]}


def compare_convergence(out: str | Path, runs: Sequence[ConvergenceRun], data: str | Path, *,
                        loader: str = "memory", nodes: int = 2, local_size: int = 2) -> list[dict]:
    """Train every run on ``nodes`` x ``local_size`` local processes; one summary row each.

    Rows are :func:`summarize`'s with :func:`add_dense_reference`'s columns. Run directories are
    ``out/<name>`` (replaced); plots and summary go to ``out/report``.

    Raises:
        ValueError: for duplicate run names or bad data (from the training loop).
    """
    from cachepipe import CacheConfig
    from trainer.launch import launch_local
    from trainer.loop import run_rank
    from trainer.report import write_report
    from trainer.run_config import RunConfig

    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"run names must be unique; got {names}")
    out = Path(out)
    rows, dirs = [], []
    for run in runs:
        run_dir = out / run.name
        cfg = RunConfig(recipe=run.recipe, data=str(data), out=str(run_dir), loader=loader,
                        cache=CacheConfig(data, out / "cache") if loader != "memory" else None, nodes=nodes,
                        local_size=local_size, device="cpu",
                        print_table=False, overwrite=True)  # out/<name> is this comparison's own
        start = time.perf_counter()
        metrics = launch_local(run_rank, nodes * local_size, cfg, local_size=local_size, threads=1)
        rows.append(summarize(run, metrics, time.perf_counter() - start))
        dirs.append(run_dir)
    add_dense_reference(rows)
    write_report(dirs, out / "report")
    return rows


def add_dense_reference(rows: list[dict]) -> None:
    """Add ``delta_top1_vs_dense`` (final top-1 minus the ``dense`` row's) and
    ``bytes_vs_dense`` (inter-node bytes over dense's, where both are recorded) to every
    :func:`summarize` row, in place; nothing when no row is named ``dense``."""
    from comm.registry import DENSE

    dense = next((r for r in rows if r["name"] == DENSE), None)
    if dense is None:
        return
    for r in rows:
        r["delta_top1_vs_dense"] = r["final_top1"] - dense["final_top1"]
        if r["inter_node_bytes"] is not None and dense["inter_node_bytes"]:
            r["bytes_vs_dense"] = r["inter_node_bytes"] / dense["inter_node_bytes"]
