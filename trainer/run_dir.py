"""The run directory (``--out``): a new run never silently replaces another run's results.

NOTE [refusing a used --out]: a fresh run into a directory that already holds a run
would cut its ``metrics.jsonl`` and overwrite its checkpoints at the first epoch, losing
a multi-day run to a repeated command. So a new run refuses a non-empty ``--out`` unless
it resumes (``--resume``: the log is cut back to the resumed epoch, by design) or the user
said ``--overwrite`` (the old run's ``metrics.jsonl`` and ``checkpoints/`` are removed
first; other files are left alone).
"""
from __future__ import annotations

import shutil
from pathlib import Path

from trainer.consensus import RankFailed, agree

__all__ = ["RUN_FILES", "prepare_out", "prepare_out_together"]

RUN_FILES = ("metrics.jsonl", "checkpoints")


def prepare_out(out: str | Path, *, resume: bool, overwrite: bool) -> None:
    """Check (and with ``overwrite`` clear) ``out`` before a run writes into it.

    Raises:
        ValueError: ``out`` is a file, or a non-empty directory while neither ``resume``
            nor ``overwrite`` is set (names the directory and both flags).
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; pass a directory")
    if resume or not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        found = ", ".join(sorted(p.name for p in out.iterdir())[:4])
        raise ValueError(f"--out {out} is not empty ({found}); pass --resume {out} to continue that run, "
                         f"--overwrite to replace it, or another --out")
    for name in RUN_FILES:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def prepare_out_together(out: str | Path, *, resume: bool, overwrite: bool, rank: int, device=None) -> None:
    """:func:`prepare_out` on rank 0, its verdict learnt by every rank (NOTE [failing
    together] in ``trainer.consensus``; ``device``: the CUDA device of an NCCL group).

    Raises:
        ValueError: on every rank, rank 0's refusal.
    """
    error = ""
    if rank == 0:
        try:
            prepare_out(out, resume=resume, overwrite=overwrite)
        except (ValueError, OSError) as exc:
            error = str(exc)
    try:
        agree(not error, error, device)
    except RankFailed as exc:
        raise ValueError(exc.failures[0]) from None
