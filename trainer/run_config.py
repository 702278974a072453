"""``RunConfig``: what one training run needs besides its recipe (paths, loader, resume)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from trainer.config import Recipe
from trainer.data import LOADERS, ON_ERROR

__all__ = ["RunConfig"]


@dataclass(frozen=True)
class RunConfig:
    """Where to read, where to write, how to resume.

    Args:
        recipe: the (overridden) recipe.
        data: ImageFolder root with ``train/`` and ``val/``.
        out: run directory (metrics.jsonl, checkpoints/).
        loader: ``torch`` (cached DataLoader), ``dali`` or ``memory``.
        cache: the cache settings, resolved once at the entry point: a
            ``cachepipe.CacheConfig`` (cache dir, L2 URLs, replicas, ..., whether the scan
            follows symlinks leaving the data root: NOTE [symlinks in the source] in
            ``cachepipe/source/scan.py``). Its ``source`` and ``cache_size`` are set per split and
            phase (``trainer.data.make_loader``). Required by the ``torch`` and ``dali``
            loaders; the trainer only hands it on.
        ckpt_every: also checkpoint every this many steps (0 = only at epoch ends).
        resume: run directory or ``last.npz`` to continue from.
        nodes, local_size: topology; None = from torchrun's environment.
        device: ``auto`` (cuda if available), ``cpu`` or ``cuda``.
        stop_after_steps: stop (after a checkpoint) at this global step; 0 = never. For
            tests of resume and for time-boxed runs.
        print_table: rank 0 prints one table row per epoch.
        ddp: exchange inside backward through DistributedDataParallel (sparse algorithms
            as its comm hook) instead of the standalone exchanger after backward.
        ranks_per_machine: ranks sharing this machine's cores, which divide them for loader
            workers (``trainer.data.loader_workers``); None: torchrun's LOCAL_WORLD_SIZE,
            else the world size.
        on_error: ``skip`` (default): a corrupt or unreadable sample is warned about,
            counted (``skipped`` in the epoch row) and replaced, so every batch stays full
            (NOTE [replacing bad samples] in ``loaders.replacement``); ``raise``: it ends the run.
        overwrite: a new run may replace the run in a non-empty ``out`` (its
            ``metrics.jsonl`` and ``checkpoints/``); without it, or ``resume``, such an
            ``out`` is refused (``trainer.run_dir``).
        allow_changes: resume even when ``settings()`` differ from the checkpoint's
            (the differences are printed); without it they are refused.
    """

    recipe: Recipe
    data: str
    out: str
    loader: str = "torch"
    cache: object | None = None
    ckpt_every: int = 0
    resume: str | None = None
    nodes: int | None = None
    local_size: int | None = None
    device: str = "auto"
    stop_after_steps: int = 0
    print_table: bool = True
    ddp: bool = False
    ranks_per_machine: int | None = None
    on_error: str = "skip"
    overwrite: bool = False
    allow_changes: bool = False

    def __post_init__(self):
        if self.loader not in LOADERS:
            raise ValueError(f"unknown loader {self.loader!r}; valid: {list(LOADERS)}")
        if self.loader == "memory" and self.recipe.train.locality == "node":
            raise ValueError("--locality node needs the cached loaders (--loader torch or dali): the memory loader "
                             "has no L2 whose placement it could follow")
        if self.ddp and any(p.comm == "auto" for p in self.recipe.phases):
            raise ValueError("--comm auto chooses among the comm engine's exchanges after a phase's first steps; "
                             "--ddp exchanges inside DDP's backward: drop one of them")
        if self.ddp and self.recipe.train.pipeline_exchange:
            raise ValueError("--ddp exchanges inside DDP's backward; --pipeline-exchange (train.pipeline_exchange) "
                             "pipelines the comm engine's exchange: drop one of them")
        if self.ckpt_every < 0 or self.stop_after_steps < 0:
            raise ValueError(f"--ckpt-every and --stop-after-steps must be >= 0; got {self.ckpt_every}, {self.stop_after_steps}")
        if self.on_error not in ON_ERROR:
            raise ValueError(f"--on-error must be one of {list(ON_ERROR)}; got {self.on_error!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda; got {self.device!r}")
        for name, v in (("nodes", self.nodes), ("local_size", self.local_size)):
            if v is not None and v < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1; got {v}")

    def settings(self) -> dict:
        """What decides the run's result and must not change silently on resume: the recipe
        (epochs, lr, density, comm, ... of every phase), the data root, the loader, DDP and
        ``follow_external_links`` when set."""
        out = {"recipe": _effective(self.recipe), "data": os.path.abspath(self.data), "loader": self.loader,
               "ddp": self.ddp}
        if getattr(self.cache, "follow_external_links", False):  # it changes which files are the data
            out["follow_external_links"] = True
        return out

    def accept_resume(self, saved: dict | None, *, announce: bool) -> None:
        """Check a checkpoint's ``settings()`` (``saved``; None: unrecorded) against this run's
        before resuming; with ``allow_changes`` the differences are printed when ``announce``.

        Raises:
            ValueError: they differ and ``allow_changes`` is not set (lists the changes).
        """
        changes = self.changes(saved or self.settings())
        if changes and not self.allow_changes:
            raise ValueError(f"--resume {self.resume}: this run differs from the checkpoint in "
                             f"{'; '.join(changes)}; rerun with the same settings, or pass --allow-changes")
        if changes and announce:
            print(f"cachepipe train: resuming with changes (--allow-changes): {'; '.join(changes)}", flush=True)

    def changes(self, saved: dict) -> list[str]:
        """``"key: saved -> now"`` for every setting that differs from ``saved`` (a
        checkpoint's ``settings()``), e.g. ``"recipe.optim.lr: 0.4 -> 0.8"``."""
        old, new = _flatten(_current_form(saved)), _flatten(self.settings())
        return [f"{k}: {old.get(k, '(unset)')!r} -> {new.get(k, '(unset)')!r}"
                for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def _current_form(saved: dict) -> dict:
    """``saved`` with its recipe written as this version writes it (a checkpoint from before
    NOTE [algorithm options in a recipe] in trainer/config.py lists every algorithm's
    options in every phase); as it is when it no longer parses (the difference is then shown)."""
    from trainer.recipes import recipe_from_dict

    try:
        return dict(saved, recipe=_effective(recipe_from_dict(saved["recipe"], "saved")))
    except (KeyError, TypeError, ValueError):
        return saved


# A dense phase (comm.Algorithm.sparse false: dense, hier, powersgd, ...) reads none of these:
# they are the top-k selection's and Deep Gradient Compression's (trainer.config.PhaseConfig).
_SPARSE_ONLY = ("density", "selector", "density_warmup_epochs", "density_warmup_steps", "density_schedule",
                "momentum_correction", "momentum_masking", "lr_scaled_residuals", "local_clipping", "dense_vectors")


def _effective(recipe) -> dict:
    """``recipe.to_dict()`` with each phase's density and ``lr_scaled_residuals`` as the
    phase uses them (an unset one is its algorithm's default, NOTE [gtopk's training
    defaults] in comm/collectives/gtopk.py): a resume compares what decides the result, so
    a checkpoint that wrote ``density: 0.01`` and a recipe that leaves it unset agree for
    ``hitopk`` and differ for ``gtopk``; a dense phase has none of :data:`_SPARSE_ONLY`, so
    resuming a dense run with another ``--density`` is no change."""
    from comm.registry import ALGORITHMS

    data = recipe.to_dict()
    for phase, row in zip(recipe.phases, data["phases"]):
        row.update(density=phase.sparse_density, lr_scaled_residuals=phase.residuals_follow_lr)
        if phase.comm in ALGORITHMS and not ALGORITHMS[phase.comm].sparse:
            for key in _SPARSE_ONLY:
                row.pop(key, None)
    return data


def _flatten(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)) and any(isinstance(v, (dict, list, tuple)) for v in value):
        items = enumerate(value)
    else:
        return {prefix: list(value) if isinstance(value, tuple) else value}
    out = {}
    for k, v in items:
        out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out
