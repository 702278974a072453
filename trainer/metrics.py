"""Per-iteration time breakdown and the per-epoch ``metrics.jsonl`` log.

The breakdown follows Figure 1 of the MLSys 2021 paper: the elapsed time of each part of
an iteration that is not overlapped by another part. Parts: ``data`` (waiting for the
next batch), ``compute`` (forward + backward, less the top-k selection run inside it),
``compress`` (top-k selection, during backward or after it), ``communicate`` (the
gradient exchange not hidden behind backward: the rest of the time in the exchanger's
``synchronize()``, waiting for what is still in flight, and with a pipelined exchange the
wait inside backward for the previous step's) and ``update`` (LARS / optimiser step).
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from comm.timings import ExchangeTimings
from trainer.atomic_file import write_atomic

__all__ = ["PARTS", "TimeBreakdown", "MetricsLog", "epoch_row", "fresh_accum", "read_metrics"]

PARTS = ("data", "compute", "compress", "communicate", "update")


class TimeBreakdown:
    """Accumulates seconds per part over iterations; ``sync`` is called before each clock
    read (``torch.cuda.synchronize`` on GPU) so asynchronous kernels are charged correctly."""

    def __init__(self, sync=None):
        self.sync = sync or (lambda: None)
        self.totals = dict.fromkeys(PARTS, 0.0)
        self.iterations = 0

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        self.sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.totals[name] += time.perf_counter() - start

    def add(self, name: str, seconds: float) -> None:
        self.totals[name] += seconds

    def add_exchange(self, seconds: float, timings: ExchangeTimings) -> None:
        """Charge ``seconds`` spent in an exchange's ``synchronize()``: its top-k selection
        (``timings.select``, the exchange's ``last_timings``) to compress and the rest to
        communicate; selection run inside backward (``select_overlapped``) moves from
        compute to compress, and waiting inside backward for a pipelined exchange
        (``drained_in_backward``) from compute to communicate."""
        compress = min(timings.select, seconds)
        overlapped, waited = timings.select_overlapped, timings.drained_in_backward
        self.totals["compute"] -= overlapped + waited
        self.totals["compress"] += compress + overlapped
        self.totals["communicate"] += seconds - compress + waited

    def per_iteration(self) -> dict[str, float]:
        """Mean seconds per iteration of each part."""
        n = max(self.iterations, 1)
        return {k: v / n for k, v in self.totals.items()}

    def state_dict(self) -> dict:
        return {"totals": dict(self.totals), "iterations": self.iterations}

    def load_state_dict(self, state: dict) -> None:
        self.totals = {k: float(state["totals"].get(k, 0.0)) for k in PARTS}
        self.iterations = int(state["iterations"])


def fresh_accum() -> dict:
    """The running sums of an epoch on one rank (kept in checkpoints as they are)."""
    return {"loss_sum": 0.0, "batches": 0, "images": 0, "seconds": 0.0, "breakdown": TimeBreakdown().state_dict(),
            "inter_node_bytes": 0, "density_sum": 0.0}


def epoch_row(recipe, epoch: int, *, comm: str, accum: dict, sums: list[float], lr: float, steps: int, world: int,
              auto: str | None = None) -> dict:
    """The metrics row of ``epoch`` before evaluation and cache counts are added.

    Args:
        recipe: the run's recipe.
        comm: the exchange that ran (what ``auto`` chose).
        accum: this rank's running sums (:func:`fresh_accum`).
        sums: loss sum, batches, inter-node bytes and residual sum of squares over all ranks.
        lr, steps, world: the learning rate now, global steps done and the world size.
        auto: why ``auto`` chose ``comm`` (NOTE [auto exchange] in comm/auto.py), if it did.
    """
    index, phase = recipe.phase_of(epoch)
    loss_sum, batches, inter_node_bytes, residual_sq = sums
    row = {"epoch": epoch, "phase": index, "size": phase.size, "batch_size": phase.batch_size,
           "cache_size": recipe.cache_size_of(phase),
           "comm": comm, "density": accum.get("density_sum", 0.0) / max(accum["batches"], 1),
           "inter_node_bytes": int(inter_node_bytes), "residual_norm": residual_sq ** 0.5,
           "lr": lr, "train_loss": loss_sum / max(batches, 1.0),
           "images_per_s": accum["images"] / max(accum["seconds"], 1e-9),
           "seconds": accum["seconds"], "steps": steps, "recipe": recipe.name, "world_size": world}
    breakdown = TimeBreakdown()
    breakdown.load_state_dict(accum["breakdown"])
    row["time_per_iter"] = breakdown.per_iteration()
    if auto is not None:
        row["auto"] = auto
    return row


class MetricsLog:
    """``<out>/metrics.jsonl``: one JSON object per epoch, appended by rank 0.

    On resume the file is cut back (atomically) to the epochs before ``first_epoch``,
    so a resumed run's log reads like an uninterrupted one.
    """

    def __init__(self, path: str | os.PathLike, first_epoch: int = 0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = [r for r in read_metrics(self.path) if r.get("epoch", 0) < first_epoch] if self.path.exists() else []
        self._write(kept)

    def _write(self, rows: list[dict]) -> None:
        write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in rows))

    def append(self, row: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The rows of a ``metrics.jsonl`` file (a run directory or the file itself).

    Raises:
        ValueError: if the file is missing or a line is not a JSON object with an
            integer ``epoch`` (names the line).
    """
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"{path} does not exist; pass a run directory written by cachepipe train --out")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"{path}:{n} is not a JSON line") from None
            if not isinstance(row, dict) or type(row.get("epoch")) is not int:
                raise ValueError(f"{path}:{n} is not a metrics row (a JSON object with an integer epoch)")
            rows.append(row)
    return rows
