"""The per-epoch table printed by rank 0 (loss, accuracy, throughput, breakdown, cache hits,
bad samples skipped and replaced).

The cache column counts the epoch's reads served by L2, L1 and the source, and the share
served by L2: the coverage the epoch saw (below 100 % when L2 holds a fixed subset of a
larger dataset, NOTE [fixed L2 subset] in ``cachepipe/warmup.py``).
"""
from __future__ import annotations

import sys

__all__ = ["HEADER", "format_row", "print_row"]

HEADER = (f"{'epoch':>5} {'px':>4} {'comm':>7} {'loss':>7} {'top1':>6} {'top5':>6} {'img/s':>7} "
          f"{'data':>6} {'fwdbwd':>6} {'compr':>6} {'comm':>6} {'update':>6} {'cache L2/L1/src (L2 %)':>26} {'skip':>5}")


def _hits(cache: dict | None) -> str:
    if not cache:
        return "-"
    l2, l1, src = cache.get("l2_hits", 0), cache.get("l1_hits", 0), cache.get("source_reads", 0)
    return f"{l2}/{l1}/{src} ({100 * l2 / max(l2 + l1 + src, 1):.0f} %)"


def format_row(row: dict) -> str:
    """One table line for a metrics row (times in ms per iteration)."""
    t = {k: 1000 * v for k, v in row.get("time_per_iter", {}).items()}
    return (f"{row['epoch']:>5} {row.get('size', 0):>4} {row.get('comm', ''):>7} {row['train_loss']:>7.3f} "
            f"{row['val_top1']:>6.1f} {row['val_top5']:>6.1f} {row['images_per_s']:>7.1f} "
            f"{t.get('data', 0):>6.1f} {t.get('compute', 0):>6.1f} {t.get('compress', 0):>6.1f} "
            f"{t.get('communicate', 0):>6.1f} {t.get('update', 0):>6.1f} {_hits(row.get('cache')):>26} "
            f"{row.get('skipped', 0):>5}")


def print_row(row: dict, header: bool = False) -> None:
    if header:
        print(HEADER + "   (times: ms per iteration)", file=sys.stdout)
    print(format_row(row), file=sys.stdout, flush=True)
