"""``RunConfig``: what one training run needs besides its recipe (paths, loader, resume)."""
from __future__ import annotations

from dataclasses import dataclass

from trainer.config import Recipe
from trainer.data import LOADERS

__all__ = ["RunConfig"]


@dataclass(frozen=True)
class RunConfig:
    """Where to read, where to write, how to resume.

    Args:
        recipe: the (overridden) recipe.
        data: ImageFolder root with ``train/`` and ``val/``.
        out: run directory (metrics.jsonl, checkpoints/).
        loader: ``torch`` (cached DataLoader), ``dali`` or ``memory``.
        cache_dir: L1 mirror / embedded Redis directory (None = the loader's default).
        redis: L2 Redis URLs; None = embedded server.
        ckpt_every: also checkpoint every this many steps (0 = only at epoch ends).
        resume: run directory or ``last.npz`` to continue from.
        nodes, local_size: topology; None = from torchrun's environment.
        device: ``auto`` (cuda if available), ``cpu`` or ``cuda``.
        stop_after_steps: stop (after a checkpoint) at this global step; 0 = never. For
            tests of resume and for time-boxed runs.
        print_table: rank 0 prints one table row per epoch.
        ddp: exchange inside backward through DistributedDataParallel (sparse algorithms
            as its comm hook) instead of the standalone exchanger after backward.
    """

    recipe: Recipe
    data: str
    out: str
    loader: str = "torch"
    cache_dir: str | None = None
    redis: tuple[str, ...] | None = None
    ckpt_every: int = 0
    resume: str | None = None
    nodes: int | None = None
    local_size: int | None = None
    device: str = "auto"
    stop_after_steps: int = 0
    print_table: bool = True
    ddp: bool = False

    def __post_init__(self):
        if self.loader not in LOADERS:
            raise ValueError(f"unknown loader {self.loader!r}; valid: {list(LOADERS)}")
        if self.loader == "memory" and self.recipe.train.locality == "node":
            raise ValueError("--locality node needs the cached loaders (--loader torch or dali): the memory loader "
                             "has no L2 whose placement it could follow")
        if self.ckpt_every < 0 or self.stop_after_steps < 0:
            raise ValueError(f"--ckpt-every and --stop-after-steps must be >= 0; got {self.ckpt_every}, {self.stop_after_steps}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda; got {self.device!r}")
        for name, v in (("nodes", self.nodes), ("local_size", self.local_size)):
            if v is not None and v < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1; got {v}")
