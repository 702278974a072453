"""Time-to-accuracy rows and plot from finished training runs (``metrics.jsonl``).

Pure functions behind ``cachepipe bench train --emulate`` (``tools.bench.parts.train_emulated``):
turn each algorithm's per-epoch metrics plus the bytes that crossed
the emulated links into one row, and draw top-1 against wall-clock time (the shape of
Figure 10 of the MLSys 2021 paper).

NOTE [time-to-accuracy clock]: the clock is the run's cumulative training wall-clock
(``seconds`` of each epoch row: every step, data wait and exchange included; the
per-epoch evaluation and checkpoint are left out, they cost every algorithm the same).
Accuracy is measured at epoch ends, so the time to a target is the end of the first
epoch whose validation top-1 reaches it.

NOTE [breakdown columns]: per iteration, from the trainer's ``time_per_iter``:
``compute`` (forward + backward), ``selection`` (top-k, the trainer's ``compress``),
``waiting`` (what the step blocks on after backward for the exchange: ``compress`` +
``communicate``), ``exchange`` (the exchange's own duration: ``exchange`` when the
trainer records it, else ``communicate``; without overlap the whole exchange runs after
backward, so it equals ``waiting`` minus ``selection``), ``data`` and ``update``. Under
DDP (``powersgd``) the exchange runs inside backward and shows in ``compute``. With the
engine's overlap the launches in the backward hooks (packing, the first collectives,
waiting there for slower ranks) stay in ``compute`` and ``exchange`` is only what is left
after backward; these columns are a training run's budget, not a measure of overlap:
``cachepipe bench overlap`` times compute alone and the exchange alone (NOTE [overlap
breakdown] in tools/bench/overlap.py).
"""
from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

__all__ = ["time_to_target", "breakdown", "check_target", "build_rows", "plot_top1_vs_time"]


def time_to_target(metrics: Sequence[Mapping], target: float) -> float | None:
    """Cumulative training seconds at the end of the first epoch with ``val_top1 >= target``
    (NOTE [time-to-accuracy clock]); None if no epoch reached it."""
    clock = 0.0
    for row in metrics:
        clock += float(row["seconds"])
        if float(row["val_top1"]) >= target:
            return clock
    return None


def breakdown(metrics: Sequence[Mapping]) -> dict[str, float]:
    """Mean milliseconds per iteration of each column of NOTE [breakdown columns] (weighted by steps)."""
    totals = dict.fromkeys(("compute", "selection", "exchange", "waiting", "data", "update"), 0.0)
    prev, steps = 0, 0
    for row in metrics:
        n = int(row["steps"]) - prev
        prev = int(row["steps"])
        steps += n
        t = row.get("time_per_iter", {})
        compress, communicate = t.get("compress", 0.0), t.get("communicate", 0.0)
        part = {"compute": t.get("compute", 0.0), "selection": compress, "exchange": t.get("exchange", communicate),
                "waiting": compress + communicate, "data": t.get("data", 0.0), "update": t.get("update", 0.0)}
        for k, v in part.items():
            totals[k] += 1000.0 * v * n
    return {f"{k}_ms": v / max(steps, 1) for k, v in totals.items()}


def _is_reference(kind: tuple[str, str, bool]) -> bool:
    """The default target's run: dense, unpipelined (the first such run: the first locality given)."""
    from comm.registry import DENSE

    comm, _locality, pipeline = kind
    return comm == DENSE and not pipeline


def check_target(kinds: Iterable[tuple[str, str, bool]], target_top1: float | None) -> None:
    """Refuse runs of these ``(comm, locality, pipeline)`` kinds that would have no target.

    Raises:
        ValueError: no ``target_top1`` and no unpipelined dense run.
    """
    if target_top1 is None and not any(_is_reference(k) for k in kinds):
        raise ValueError("the default target is the dense run's final top-1 minus 1 point: include dense in "
                         "--comm (off in --pipeline-exchange) or pass --target-top1")


def build_rows(runs: Mapping[str, Mapping], target_top1: float | None = None) -> list[dict]:
    """One row per run, in ``runs`` order.

    Args:
        runs: ``run name -> {"metrics": [epoch rows], "inter_node_bytes": int, "job_s": float}``,
            optionally ``"comm"``, ``"locality"`` and ``"pipeline"`` (default: the name,
            ``"global"`` and False).
        target_top1: the target; None = the final top-1 of the first unpipelined ``dense``
            run minus 1 point.

    Returns:
        Rows with ``comm``, ``ran`` (the last epoch's exchange: what ``auto`` chose), ``locality``,
        ``pipeline``, ``final_top1``, ``best_top1``, ``target_top1``,
        ``seconds_to_target`` (None if never reached), ``seconds``, ``epochs``, ``steps``,
        ``step_s``, ``inter_node_bytes_per_step``, ``job_s``, the breakdown columns
        (``*_ms``), ``val_s`` (seconds per validation), ``epoch_s`` and ``data_ms_per_epoch``
        (each epoch's seconds and data wait per step: a slow source's first epoch) and ``speedup_to_target_vs_dense`` when both
        reached the target.

    Raises:
        ValueError: no target given and no ``dense`` run, or a run without epochs.
    """
    for name, run in runs.items():
        if not run["metrics"]:
            raise ValueError(f"the {name} run has no finished epoch (metrics.jsonl is empty)")
    kinds = {name: (run.get("comm", name), run.get("locality", "global"), bool(run.get("pipeline", False)))
             for name, run in runs.items()}
    dense = next((name for name, kind in kinds.items() if _is_reference(kind)), None)
    if target_top1 is None:
        check_target(kinds.values(), target_top1)
        target_top1 = float(runs[dense]["metrics"][-1]["val_top1"]) - 1.0
    rows = []
    for name, run in runs.items():
        metrics = run["metrics"]
        comm, locality, pipeline = kinds[name]
        seconds = sum(float(r["seconds"]) for r in metrics)
        steps = int(metrics[-1]["steps"])
        rows.append({"comm": comm, "ran": metrics[-1].get("comm", comm), "locality": locality, "pipeline": pipeline,
                     "final_top1": float(metrics[-1]["val_top1"]),
                     "best_top1": max(float(r["val_top1"]) for r in metrics), "target_top1": target_top1,
                     "seconds_to_target": time_to_target(metrics, target_top1), "seconds": seconds,
                     "epochs": len(metrics), "steps": steps, "step_s": seconds / max(steps, 1),
                     "inter_node_bytes_per_step": run["inter_node_bytes"] / max(steps, 1), "job_s": run["job_s"],
                     "val_s": sum(float(r.get("val_seconds", 0.0)) for r in metrics) / len(metrics),
                     "epoch_s": [round(float(r["seconds"]), 3) for r in metrics],
                     "data_ms_per_epoch": [round(1000.0 * float(r.get("time_per_iter", {}).get("data", 0.0)), 2)
                                           for r in metrics],
                     **breakdown(metrics)})
    base = rows[list(runs).index(dense)]["seconds_to_target"] if dense is not None else None
    for r in rows:
        if base is not None and r["seconds_to_target"]:
            r["speedup_to_target_vs_dense"] = base / r["seconds_to_target"]
    return rows


def plot_top1_vs_time(runs: Mapping[str, Sequence[Mapping]], target_top1: float, path: str | Path,
                      title: str = "") -> Path:
    """Validation top-1 against cumulative training wall-clock, one line per run,
    the target as a dashed line; written to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, (name, metrics) in enumerate(runs.items()):
        clock, xs, ys = 0.0, [], []
        for row in metrics:
            clock += float(row["seconds"])
            xs.append(clock)
            ys.append(float(row["val_top1"]))
        ax.plot(xs, ys, "-", marker="o", ms=3, color=f"C{i % 10}", label=name)
    ax.axhline(target_top1, color="gray", ls="--", lw=1, label=f"target {target_top1:.1f}%")
    ax.set_xlabel("training wall-clock time (s)")
    ax.set_ylabel("validation top-1 (%)")
    if title:
        ax.set_title(textwrap.fill(title, 95), fontsize=9)  # long titles wrap, not clip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
