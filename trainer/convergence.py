"""Convergence comparison of gradient-exchange algorithms on the demo dataset.

Trains the ``demo`` recipe once per algorithm (same seed, data, epochs; 4 processes as
2 nodes x 2 on gloo), keeps each run's directory and draws them together with
``trainer.report``. Used by ``cachepipe bench train --convergence DIR``.
"""
from __future__ import annotations

import time
from pathlib import Path

__all__ = ["compare_convergence"]


def compare_convergence(out: str | Path, *, algorithms=("dense", "hitopk", "gtopk"), density: float = 0.01,
                        selector: str = "mstopk", epochs: int | None = None, data: str | Path | None = None,
                        classes: int = 10, per_class: int = 120, val_per_class: int = 30, seed: int = 0,
                        loader: str = "memory") -> list[dict]:
    """Train the demo recipe with each algorithm; return one summary row per algorithm.

    Rows: ``algorithm``, ``density``, ``final_top1``, ``best_top1``, ``final_loss``,
    ``delta_top1_vs_dense`` (when dense ran), ``seconds``. Run directories are
    ``out/<algorithm>``; plots and summary go to ``out/report``.

    Raises:
        ValueError: for unknown algorithm names.
    """
    from cachepipe import CacheConfig
    from tools.demo_dataset import make_dataset
    from tools.demo import DEMO_LOCAL_SIZE, DEMO_NODES
    from trainer.launch import launch_local
    from trainer.loop import run_rank
    from trainer.recipes import load_recipe, override
    from trainer.report import write_report
    from trainer.run_config import RunConfig

    out = Path(out)
    data = Path(data) if data else out / "data"
    base = load_recipe("demo")
    if not (data / "train").is_dir():
        make_dataset(data, classes=classes, per_class=per_class, val_per_class=val_per_class,
                     size=base.train.cache_size, seed=0)
    rows, runs = [], []
    for name in algorithms:
        recipe = override(base, comm=name, density=density, selector=selector, epochs=epochs,
                          sets=[f"train.seed={seed}"])
        run_dir = out / name
        cfg = RunConfig(recipe=recipe, data=str(data), out=str(run_dir), loader=loader,
                        cache=CacheConfig(data, out / "cache") if loader != "memory" else None,
                        nodes=DEMO_NODES, local_size=DEMO_LOCAL_SIZE, device="cpu",
                        print_table=False, overwrite=True)  # out/<algorithm> is this comparison's own
        start = time.perf_counter()
        metrics = launch_local(run_rank, DEMO_NODES * DEMO_LOCAL_SIZE, cfg, local_size=DEMO_LOCAL_SIZE, threads=1)
        rows.append({"algorithm": name, "density": density if name != "dense" else 1.0,
                     "final_top1": metrics[-1]["val_top1"], "best_top1": max(m["val_top1"] for m in metrics),
                     "final_top5": metrics[-1]["val_top5"], "final_loss": metrics[-1]["train_loss"],
                     "epochs": len(metrics), "seconds": time.perf_counter() - start})
        runs.append(run_dir)
    dense = next((r["final_top1"] for r in rows if r["algorithm"] == "dense"), None)
    for r in rows:
        if dense is not None:
            r["delta_top1_vs_dense"] = r["final_top1"] - dense
    write_report(runs, out / "report")
    return rows
