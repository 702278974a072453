"""What rank 0 prints: the per-epoch table (loss, accuracy, throughput, breakdown, cache
hits, bad samples skipped and replaced), a progress bar within an epoch, and the
configuration and final lines around them (the same for ``train`` and ``train --demo``).

The cache column counts the epoch's reads served by L2, L1 and the source, and the share
served by L2: the coverage the epoch saw (below 100 % when L2 holds a fixed subset of a
larger dataset, NOTE [fixed L2 subset] in ``cachepipe/warmup.py``).
"""
from __future__ import annotations

import sys

from comm.registry import get_algorithm
from trainer.config import AUTO

__all__ = ["HEADER", "describe_run", "epoch_bar", "final_line", "format_row", "print_finished", "print_row"]

# Two header lines: which columns belong to training, which to validation, which to the
# time per training iteration (the MLSys paper's Figure 1 parts) and which to the cache
# (hits per level, and bad samples skipped and replaced).
_GROUPS = (f"{'':>5} {'':>4} {'':>7} {'train':^15} | {'validation':^21} | "
           f"{'train: ms per iteration':^34} | {'train reads':^28}").rstrip()
HEADER = (f"{'epoch':>5} {'px':>4} {'comm':>7} {'loss':>7} {'img/s':>7} | {'loss':>7} {'top1':>6} {'top5':>6} | "
          f"{'data':>6} {'fwdbwd':>6} {'compr':>6} {'comm':>6} {'update':>6} | {'L2/L1/src (L2 %)':>22} {'skip':>5}")


def _hits(cache: dict | None) -> str:
    if not cache:
        return "-"
    l2, l1, src = cache.get("l2_hits", 0), cache.get("l1_hits", 0), cache.get("source_reads", 0)
    return f"{l2}/{l1}/{src} ({100 * l2 / max(l2 + l1 + src, 1):.0f} %)"


def format_row(row: dict) -> str:
    """One table line for a metrics row (times in ms per iteration)."""
    t = {k: 1000 * v for k, v in row.get("time_per_iter", {}).items()}
    return (f"{row['epoch']:>5} {row.get('size', 0):>4} {row.get('comm', ''):>7} {row['train_loss']:>7.3f} "
            f"{row['images_per_s']:>7.1f} | {row.get('val_loss', float('nan')):>7.3f} {row['val_top1']:>6.1f} "
            f"{row['val_top5']:>6.1f} | {t.get('data', 0):>6.1f} {t.get('compute', 0):>6.1f} "
            f"{t.get('compress', 0):>6.1f} {t.get('communicate', 0):>6.1f} {t.get('update', 0):>6.1f} | "
            f"{_hits(row.get('cache')):>22} {row.get('skipped', 0):>5}")


def print_row(row: dict, header: bool = False) -> None:
    """Print ``row`` as a table line (after the two header lines when ``header``)."""
    if header:
        print(_GROUPS + "\n" + HEADER, file=sys.stdout)
    print(format_row(row), file=sys.stdout, flush=True)


class _NoBar:
    def step(self, loss: float) -> None:
        pass

    def close(self) -> None:
        pass


class _Bar:
    """tqdm on stderr, cleared when the epoch ends so the table row takes its place."""

    def __init__(self, epoch: int, steps: int, done: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=steps, initial=done, desc=f"epoch {epoch}", unit="step", leave=False,
                        dynamic_ncols=True, file=sys.stderr)

    def step(self, loss: float) -> None:
        self.bar.set_postfix_str(f"loss {loss:.3f}", refresh=False)
        self.bar.update()

    def close(self) -> None:
        self.bar.close()


def epoch_bar(epoch: int, steps: int, done: int = 0, *, show: bool = True):
    """A progress bar over an epoch's ``steps`` (``done`` already trained), shown only when
    ``show`` and stderr is a terminal (a log file gets the table rows alone). Has
    ``step(loss)`` and ``close()``."""
    if not show or not sys.stderr.isatty():
        return _NoBar()
    return _Bar(epoch, steps, done)


def describe_run(recipe, *, workers: str, loader: str, why: str = "") -> str:
    """The configuration line printed before training: model, epochs, sizes, workers, comm, loader."""
    phases = recipe.phases
    sizes = " > ".join(dict.fromkeys(f"{p.size}" for p in phases)) + " px"
    comms = []
    for p in phases:
        sparse = p.comm == AUTO or get_algorithm(p.comm).sparse  # auto: if it chooses its sparse candidate
        text = p.comm + (f" (density {p.sparse_density:g}, {p.selector})" if sparse else "")
        if text not in comms:
            comms.append(text)
    line = (f"{recipe.model.name} (recipe {recipe.name}), {recipe.total_epochs} epochs at {sizes}, batch "
            f"{' > '.join(dict.fromkeys(str(p.batch_size) for p in phases))} per worker, {workers}, "
            f"comm {' > '.join(comms)}, loader {loader}")
    return line + (f" ({why})" if why else "")


def final_line(rows: list[dict], seconds: float, out) -> str:
    """The line printed after training: final accuracy, time, where the metrics are."""
    from pathlib import Path

    out = Path(out)
    last = rows[-1]
    return (f"final top-1 {last['val_top1']:.1f}%, top-5 {last['val_top5']:.1f}%, validation loss "
            f"{last.get('val_loss', float('nan')):.3f} after epoch {last['epoch']} in {seconds:.0f} s; "
            f"metrics in {out / 'metrics.jsonl'} (plot: cachepipe report {out})")


def print_finished(rows: list[dict], out, epochs: int) -> None:
    """What resuming a run with no epoch left prints: its table (the header and the rows of
    its ``metrics.jsonl``) and that nothing was trained."""
    for i, row in enumerate(rows):
        print_row(row, header=i == 0)
    print(f"train: the run in {out} has trained all {epochs} epochs; nothing to resume (to train on: "
          f"--epochs N with --allow-changes)", flush=True)
