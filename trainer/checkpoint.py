"""Checkpoints: two generations, each a shared file written by rank 0 plus one small file per rank.

``<out>/checkpoints/gen<G>.npz`` holds the model, optimiser, loss scaler, epoch, step and
the run's settings; ``gen<G>.rank<R>.npz`` holds what differs per rank: error-feedback
residuals, the sampler position, RNG states and the partial-epoch accumulators. Every file
is written atomically and checksummed (NOTE [no pickle on disk], NOTE [checksummed state
files] in ``trainer.serialize``).

NOTE [two checkpoint generations]: writing generation G: every rank writes its rank file,
all ranks agree that they did (NOTE [failing together] in ``trainer.consensus``), rank 0
writes the shared file, all agree again, then files older than G - 1 are removed. So a
crash or a failed write at any moment leaves generation G - 1 (or G) complete, and a
damaged newest generation (truncated, bit-flipped, crafted, a rank file missing) is
reported and the older one is used: ``load`` takes the newest generation that every rank
can read and verify, the same on all ranks.
"""
from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from comm import collective_ops as ops
from trainer.consensus import RankFailed, agree
from trainer.serialize import load_state, save_state

__all__ = ["Checkpoints", "CheckpointMismatch", "rng_state", "set_rng_state", "checkpoint_dir"]

KEEP = 2
_SHARED = re.compile(r"gen(\d+)\.npz")
_FILE = re.compile(r"gen(\d+)(?:\.rank(\d+))?\.npz")


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


class Checkpoints:
    """The checkpoint generations of one run directory (NOTE [two checkpoint generations]).

    Args:
        folder: a run directory (its ``checkpoints/``) or the ``checkpoints/`` folder itself.
        rank: this rank.
        device: where NCCL collectives run (``None`` with gloo).

    Attributes:
        generation: the last generation written or loaded (0: none).
    """

    def __init__(self, folder: str | Path, rank: int, device: torch.device | None = None) -> None:
        folder = Path(folder)
        self.folder = folder if folder.name == "checkpoints" else checkpoint_dir(folder)
        self.rank, self.device = rank, device
        self.generation = 0

    def shared_path(self, generation: int) -> Path:
        return self.folder / f"gen{generation}.npz"

    def rank_path(self, generation: int, rank: int | None = None) -> Path:
        return self.folder / f"gen{generation}.rank{self.rank if rank is None else rank}.npz"

    def generations(self) -> list[int]:
        """Generations with a shared file, newest first."""
        found = (_SHARED.fullmatch(p.name) for p in self.folder.glob("gen*.npz")) if self.folder.is_dir() else ()
        return sorted((int(m.group(1)) for m in found if m), reverse=True)

    def save(self, shared: dict, local: dict) -> Path:
        """Write the next generation (collective); returns its shared file.

        Raises:
            RankFailed: on every rank, when a file could not be written on any rank (the
                error names the rank and the file); the previous generation stays.
        """
        generation = self.generation + 1
        self._write(self.rank_path(generation), local)
        if self.rank == 0:
            self._write(self.shared_path(generation), dict(shared, generation=generation))
        else:
            agree(True, device=self.device)
        self.generation = generation
        for old in self.folder.glob("gen*.npz"):
            m = _FILE.fullmatch(old.name)
            if m and int(m.group(1)) <= generation - KEEP and int(m.group(2) or 0) == self.rank:
                old.unlink(missing_ok=True)  # rank 0 removes the shared files too
        return self.shared_path(generation)

    def _write(self, path: Path, state: dict) -> None:
        try:
            save_state(path, state)
            error = ""
        except OSError as exc:
            error = f"cannot write checkpoint {path}: {exc.strerror or exc}"
        agree(not error, error, self.device)

    def load(self, expect: dict) -> tuple[dict, dict]:
        """Read the newest generation every rank can verify (collective): ``(shared, this rank's)``.

        Args:
            expect: fields that must match (``model_name``, ``world_size``, ...).

        Raises:
            ValueError: one line, on every rank, when no generation is usable (naming the
                folder and why) or the checkpoint was written by another model / world size.
        """
        candidates = self._candidates()
        reasons = []
        for generation in candidates:
            error = ""
            try:
                shared = load_state(self.shared_path(generation))
                _check_identity(self.shared_path(generation), shared, expect)
                state = load_state(self.rank_path(generation))
            except CheckpointMismatch:
                raise
            except ValueError as exc:
                error = str(exc)
            try:
                agree(not error, error, self.device)
            except RankFailed as exc:
                reasons.append(f"generation {generation}: {exc}")
                if self.rank == 0:
                    print(f"cachepipe train: checkpoint generation {generation} in {self.folder} is unusable "
                          f"({exc}); trying an older one", file=sys.stderr, flush=True)
                continue
            if reasons and self.rank == 0:
                print(f"cachepipe train: resuming from the older checkpoint {self.shared_path(generation)}",
                      file=sys.stderr, flush=True)
            self.generation = generation
            return shared, state
        if not candidates:
            raise ValueError(f"no checkpoint in {self.folder}; pass --resume with a run directory that has "
                             f"checkpoints/gen<N>.npz")
        raise ValueError(f"no usable checkpoint in {self.folder}: " + "; ".join(reasons))

    def _candidates(self) -> list[int]:
        """Rank 0's generations (newest first), the same list on every rank."""
        mine = self.generations()[:8]
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return mine
        t = torch.full((9,), -1, dtype=torch.int64)
        t[: len(mine)] = torch.tensor(mine, dtype=torch.int64)
        on = t.to(self.device) if self.device is not None and dist.get_backend() == "nccl" else t
        ops.broadcast(on, src=0)
        return [int(g) for g in on.cpu().tolist() if g >= 0]


class CheckpointMismatch(ValueError):
    """The checkpoint was written by another model, class count, world size or topology."""


def _shape(topology) -> str:
    nodes, local = topology
    return f"{nodes} node{'s' if nodes != 1 else ''} x {local}"


def _check_identity(path: Path, shared: dict, expect: dict) -> None:
    """NOTE [topology of a checkpoint]: the residuals, sampler positions and RNG states of
    rank ``r`` belong to its place in the ``nodes x local_size`` layout (a hierarchical
    exchange keeps node-sized residuals, node-local sampling deals samples per node), so
    the layout must match as the world size does. Checkpoints written before it was
    recorded carry no ``topology`` and are not checked for it."""
    for key, value in expect.items():
        if key == "topology":
            saved = shared.get(key)
            if saved is not None and list(saved) != list(value):
                raise CheckpointMismatch(
                    f"checkpoint {path} was written on {_shape(saved)} ranks but this run has {_shape(value)}; "
                    f"resume with --nodes {saved[0]} --local-size {saved[1]} or start a fresh --out")
            continue
        if shared.get(key) != value:
            raise CheckpointMismatch(f"checkpoint {path} was written with {key}={shared.get(key)!r} but this run has "
                             f"{key}={value!r}; resume with the same {key} or start a fresh --out")
