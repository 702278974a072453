"""Plots and a Markdown summary of one or more training runs (``cachepipe report``).

- ``accuracy.png``: validation top-1 (solid) and top-5 (dashed) per epoch, runs overlaid;
- ``loss.png``: training loss (solid) and validation loss (dashed) per epoch;
- ``breakdown.png``: mean time per iteration as stacked bars (data, forward+backward,
  compression, communication, update), one bar per run and phase, labelled with the
  image size, like Figure 1 of the MLSys 2021 paper;
- ``residual.png`` (when a run has error-feedback residuals): the L2 norm of all
  workers' residuals at the end of each epoch, log scale, so a diverging residual shows;
- ``summary.md``: a table of final / best accuracy, throughput, time, total inter-node
  bytes of the gradient exchange and final residual norm per run.

Epochs are numbered from 0 as in the console table and ``metrics.jsonl``; runs are named
by ``run_labels`` (the part of their path that tells them apart, recipe, workers, comm).
"""
from __future__ import annotations

import os
from pathlib import Path

from trainer.atomic_file import write_atomic
from trainer.metrics import PARTS, read_metrics

__all__ = ["breakdown_figure", "curve", "run_labels", "write_report", "summarise"]

_LABELS = {"data": "data wait", "compute": "forward + backward", "compress": "compression",
           "communicate": "communication", "update": "LARS / update"}


def run_labels(run_dirs: list[str | os.PathLike], runs: list[list[dict]]) -> list[str]:
    """A legend label per run: the shortest ending of its path that tells it from the
    others (every by-hand run's folder is ``train``, so ``a/train`` and ``b/train``), with
    its recipe, workers and gradient exchange when the metrics say them."""
    parts = [Path(os.path.abspath(d)).parts for d in run_dirs]
    labels = []
    for i, (p, rows) in enumerate(zip(parts, runs)):
        n = 2  # at least parent/name: "runs/train" says more than "train"
        while n < len(p) and any(p[-n:] == q[-n:] for j, q in enumerate(parts) if j != i):
            n += 1
        what = [str(rows[-1]["recipe"])] if rows[-1].get("recipe") else []
        if rows[-1].get("world_size"):
            world = int(rows[-1]["world_size"])
            what.append(f"{world} worker{'s' if world > 1 else ''}")
        comms = list(dict.fromkeys(str(r.get("comm")) for r in rows if r.get("comm")))
        if comms:
            what.append(" > ".join(comms))
        name = "/".join(p[-n:]) if len(p) > 1 else str(run_dirs[i])
        labels.append(f"{name} ({', '.join(what)})" if what else name)
    return labels


def _phases(rows: list[dict]) -> list[tuple[str, dict]]:
    """Mean per-iteration breakdown per phase (weighted by steps)."""
    out: dict[tuple, list] = {}
    prev_steps = 0
    for r in rows:
        steps = max(r.get("steps", 0) - prev_steps, 1)
        prev_steps = r.get("steps", prev_steps)
        key = (r.get("phase", 0), r.get("size", "?"), r.get("comm", "?"))
        acc = out.setdefault(key, [0, dict.fromkeys(PARTS, 0.0)])
        acc[0] += steps
        for part in PARTS:
            acc[1][part] += r.get("time_per_iter", {}).get(part, 0.0) * steps
    return [(f"{size}px {comm}", {p: v / n for p, v in parts.items()}) for (_, size, comm), (n, parts) in sorted(out.items())]


def curve(rows: list[dict], key: str) -> list[tuple[int, float]]:
    """``(epoch, value)`` points of one metric, epochs numbered as in the console table and
    ``metrics.jsonl`` (from 0)."""
    return [(r["epoch"], r[key]) for r in rows if key in r]


def _num(value, spec: str) -> str:
    """``value`` formatted with ``spec``, ``-`` when a row does not record it (an older
    run, a run without a validation split)."""
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def summarise(runs: dict[str, list[dict]]) -> str:
    """Markdown summary: one row per run (``-`` where its metrics do not say)."""
    lines = ["| run | epochs | final top-1 | final top-5 | best top-1 | final loss | images/s | train s | "
             + " | ".join(f"{p} ms/it" for p in PARTS) + " | inter-node MB | residual norm |",
             "|" + "---|" * (10 + len(PARTS))]
    for name, rows in runs.items():
        last = rows[-1]
        seconds = sum(r.get("seconds", 0.0) for r in rows)
        images_per_s = sum(r.get("images_per_s", 0.0) * r.get("seconds", 0.0) for r in rows) / max(seconds, 1e-9)
        mean = {p: sum(r.get("time_per_iter", {}).get(p, 0.0) for r in rows) / len(rows) for p in PARTS}
        best = max((r["val_top1"] for r in rows if isinstance(r.get("val_top1"), (int, float))), default=None)
        lines.append(f"| {name} | {len(rows)} | {_num(last.get('val_top1'), '.2f')} | "
                     f"{_num(last.get('val_top5'), '.2f')} | {_num(best, '.2f')} | "
                     f"{_num(last.get('train_loss'), '.4f')} | {images_per_s:.1f} | "
                     f"{seconds:.1f} | " + " | ".join(f"{1000 * mean[p]:.1f}" for p in PARTS)
                     + f" | {sum(r.get('inter_node_bytes', 0) for r in rows) / 1e6:.2f} | "
                     f"{last.get('residual_norm', 0.0):.3g} |")
    return "\n".join(lines) + "\n"


def breakdown_figure(runs: dict[str, list[dict]]):
    """Stacked bars of the mean time per iteration, one per run and phase; the legend sits
    beside the bars, never on them."""
    import matplotlib.pyplot as plt

    bars = [(f"{name}\n{label}", parts) for name, rows in runs.items() for label, parts in _phases(rows)]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(bars) + 2) + 2.2, 4.2))
    bottom = [0.0] * len(bars)
    for i, part in enumerate(PARTS):
        heights = [1000 * parts[part] for _, parts in bars]
        ax.bar(range(len(bars)), heights, bottom=bottom, color=f"C{i}", label=_LABELS[part])
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=7)
    ax.set_ylabel("time per iteration (ms)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def write_report(run_dirs: list[str | os.PathLike], out: str | os.PathLike) -> list[Path]:
    """Write the plots and ``summary.md`` for ``run_dirs`` into ``out``; returns the paths.

    Raises:
        ValueError: when a run directory has no (or an empty) ``metrics.jsonl``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loaded = []
    for d in run_dirs:
        rows = read_metrics(d)
        if not rows:
            raise ValueError(f"{d}: metrics.jsonl has no epochs yet")
        loaded.append(rows)
    runs = dict(zip(run_labels(run_dirs, loaded), loaded))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for fname, keys, ylabel in (("accuracy.png", ("val_top1", "val_top5"), "validation accuracy (%)"),
                                ("loss.png", ("train_loss", "val_loss"), "loss")):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for i, (name, rows) in enumerate(runs.items()):
            color = f"C{i % 10}"
            for key, style in zip(keys, ("-", "--")):
                pts = curve(rows, key)
                if pts:
                    ax.plot(*zip(*pts), style, color=color, marker="o", ms=3, label=f"{name} {key}")
        ax.set_xlabel("epoch (from 0, as in the console and metrics.jsonl)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # long run labels: beside the plot
        fig.tight_layout()
        fig.savefig(out / fname, dpi=120, bbox_inches="tight")
        plt.close(fig)
        written.append(out / fname)
    fig = breakdown_figure(runs)
    fig.savefig(out / "breakdown.png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    written.append(out / "breakdown.png")
    if any(r.get("residual_norm") for rows in runs.values() for r in rows):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for i, (name, rows) in enumerate(runs.items()):
            pts = [(e, v) for e, v in curve(rows, "residual_norm") if v > 0]
            if pts:
                ax.plot(*zip(*pts), "-", color=f"C{i % 10}", marker="o", ms=3, label=name)
        ax.set_yscale("log")
        ax.set_xlabel("epoch (from 0, as in the console and metrics.jsonl)")
        ax.set_ylabel("residual L2 norm, all workers (end of epoch)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
        fig.savefig(out / "residual.png", dpi=120, bbox_inches="tight")
        plt.close(fig)
        written.append(out / "residual.png")
    summary = out / "summary.md"
    write_atomic(summary, f"# Training report\n\nRuns: {', '.join(runs)}\n\n" + summarise(runs)
                   + f"\nPlots: {', '.join(p.name for p in written)}\n")
    written.append(summary)
    return written
