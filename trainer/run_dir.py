"""The run directory (``--out``): a new run never silently replaces another run's results.

NOTE [refusing a used --out]: a fresh run into a directory that already holds a run
would cut its ``metrics.jsonl`` and overwrite its checkpoints at the first epoch, losing
a multi-day run to a repeated command. So a run refuses a non-empty ``--out`` unless it
resumes that very run (``--resume`` naming ``--out``: the log is cut back to the resumed
epoch, by design) or the user said ``--overwrite`` (the old run's ``metrics.jsonl`` and
``checkpoints/`` are removed first; other files are left alone). Resuming run A into
another run's ``--out`` B is a new run as far as B is concerned: without ``--overwrite``
it would delete B's older generation and overwrite the newer one and B's metrics.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from trainer.consensus import RankFailed, agree

__all__ = ["RUN_FILES", "prepare_out", "prepare_out_together", "resumed_run"]

RUN_FILES = ("metrics.jsonl", "checkpoints")


def resumed_run(resume: str | os.PathLike) -> Path:
    """The run directory ``--resume`` names (it may name the run's ``checkpoints/`` folder)."""
    path = Path(resume)
    return path.parent if path.name == "checkpoints" else path


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.is_dir() and b.is_dir() and os.path.samefile(a, b)
    except OSError:
        return False


def prepare_out(out: str | Path, *, resume: str | os.PathLike | None, overwrite: bool) -> None:
    """Check (and with ``overwrite`` clear) ``out`` before a run writes into it
    (NOTE [refusing a used --out]).

    Args:
        out: the run directory.
        resume: the ``--resume`` path (a run directory or its ``checkpoints/``), or None.
        overwrite: a non-empty ``out`` may be replaced.

    Raises:
        ValueError: ``out`` is a file, or a non-empty directory that is neither the run
            ``resume`` continues nor to be overwritten (names the directory and the flags).
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; pass a directory")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if resume is not None and _same_dir(resumed_run(resume), out):
        return
    if not overwrite:
        found = ", ".join(sorted(p.name for p in out.iterdir())[:4])
        if resume is not None:
            raise ValueError(f"--out {out} holds another run ({found}) than the one --resume {resume} continues; "
                             f"pass --overwrite to replace it with the resumed run, or another --out")
        raise ValueError(f"--out {out} is not empty ({found}); pass --resume {out} to continue that run, "
                         f"--overwrite to replace it, or another --out")
    for name in RUN_FILES:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def prepare_out_together(out: str | Path, *, resume: str | os.PathLike | None, overwrite: bool, rank: int,
                         device=None) -> None:
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
