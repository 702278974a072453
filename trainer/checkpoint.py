"""Checkpoints: one shared file written by rank 0 plus one small file per rank.

``<out>/checkpoints/last.npz`` holds the model, optimiser, loss scaler, epoch, step
and the recipe; ``rank<R>.step<S>.npz`` holds what differs per rank: error-feedback
residuals, the sampler position, RNG states and the partial-epoch accumulators. All files are
written atomically (NOTE [no pickle on disk] in ``trainer.serialize``); the rank files
of step S are complete before ``last.npz`` names S, so a crash at any moment leaves the
previous checkpoint loadable.
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from comm import collective_ops as ops
from trainer.serialize import load_state, save_state

__all__ = ["save_checkpoint", "load_checkpoint", "rng_state", "set_rng_state", "checkpoint_dir"]


def checkpoint_dir(out: str | Path) -> Path:
    return Path(out) / "checkpoints"


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(tuple(state["numpy"]))
    random.setstate((state["python"][0], tuple(state["python"][1]), state["python"][2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _barrier() -> None:
    if dist.is_initialized():
        ops.barrier()


def save_checkpoint(out: str | Path, *, rank: int, step: int, shared: dict, local: dict) -> Path:
    """Write this rank's file, then (rank 0) the shared file naming ``step``; collective.

    Returns:
        The path of the shared file.
    """
    folder = checkpoint_dir(out)
    save_state(folder / f"rank{rank}.step{step}.npz", local)
    _barrier()
    if rank == 0:
        save_state(folder / "last.npz", dict(shared, step=step))
    _barrier()
    for old in folder.glob(f"rank{rank}.step*.npz"):
        if old.name != f"rank{rank}.step{step}.npz":
            old.unlink(missing_ok=True)
    return folder / "last.npz"


def load_checkpoint(path: str | Path, *, rank: int, expect: dict) -> tuple[dict, dict]:
    """Read the shared state and this rank's state of the checkpoint at ``path``.

    Args:
        path: ``last.npz`` or a run directory (its ``checkpoints/last.npz``).
        rank: this rank.
        expect: fields that must match (``model``, ``recipe``, ``world_size``, ...).

    Raises:
        ValueError: one line when the file is missing or was written by another
            model / recipe / world size.
    """
    path = Path(path)
    if path.is_dir():
        path = checkpoint_dir(path) / "last.npz" if (checkpoint_dir(path) / "last.npz").exists() else path / "last.npz"
    if not path.is_file():
        raise ValueError(f"no checkpoint at {path}; pass --resume with a run directory that has checkpoints/last.npz")
    shared = load_state(path)
    for key, value in expect.items():
        if shared.get(key) != value:
            raise ValueError(f"checkpoint {path} was written with {key}={shared.get(key)!r} but this run has "
                             f"{key}={value!r}; resume with the same {key} or start a fresh --out")
    local_path = path.parent / f"rank{rank}.step{shared['step']}.npz"
    if not local_path.is_file():
        raise ValueError(f"checkpoint {path} lacks {local_path.name}; it is incomplete")
    return shared, load_state(local_path)
