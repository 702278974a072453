"""A recipe's phases as a run would train them on a cluster it has not got: steps, the
density warm-up and what ``--comm auto`` would price (for ``cachepipe plan``).

Every count comes from the functions the training run itself uses
(:func:`trainer.schedules.steps_per_epoch`, :func:`trainer.schedules.phase_warmups`,
:func:`trainer.schedules.mean_density`, :func:`trainer.auto_exchange.provisional_steps`),
so the plan's phases are the run's.

Example:
    >>> from trainer.recipes import load_recipe
    >>> plans = phase_plans(load_recipe("dawnbench28"), train_samples=1_281_167, world_size=128)
    >>> [(p.size, p.steps_per_epoch, p.steps) for p in plans]
    [(96, 39, 507), (128, 39, 429), (224, 39, 117), (288, 78, 78)]
"""
from __future__ import annotations

from dataclasses import dataclass

from trainer.auto_exchange import provisional_steps
from trainer.config import AUTO, Recipe
from trainer.schedules import mean_density, phase_warmups, steps_per_epoch

__all__ = ["PhasePlan", "phase_plans"]


@dataclass(frozen=True)
class PhasePlan:
    """One phase of a recipe on ``world_size`` GPUs.

    Attributes:
        index: the phase's position in the recipe.
        comm: the phase's exchange as the recipe names it (``auto`` or an algorithm).
        size, batch_size, epochs, cache_size: the phase's image size, batch per GPU,
            epochs and the cached size it reads.
        density: the density its sparse exchange settles at.
        steps_per_epoch, steps: its steps per epoch and in all.
        density_warmup_steps: its density warm-up (NOTE [warm-ups in steps] in trainer/schedules.py).
        provisional_steps: for ``auto``, the first steps that run the sparse candidate
            before the choice (0 otherwise).
        mean_density: the sparse exchange's mean density over the steps after those:
            what ``auto`` prices it at (its mean over the whole phase when not ``auto``).
    """

    index: int
    comm: str
    size: int
    batch_size: int
    epochs: int
    cache_size: int
    density: float
    steps_per_epoch: int
    steps: int
    density_warmup_steps: int
    provisional_steps: int
    mean_density: float


def phase_plans(recipe: Recipe, *, train_samples: int, world_size: int) -> list[PhasePlan]:
    """The phases of ``recipe`` trained on ``train_samples`` images by ``world_size`` GPUs.

    Raises:
        ValueError: for fewer than one sample or GPU, or a warm-up longer than its phase
            (as the training run refuses it).
    """
    if train_samples < 1 or world_size < 1:
        raise ValueError(f"need at least one sample and one GPU, got {train_samples=} and {world_size=}")
    plans = []
    for index, phase in enumerate(recipe.phases):
        per_epoch = steps_per_epoch(train_samples, world_size, phase.batch_size)
        warmup, _ = phase_warmups(recipe, index, per_epoch)
        steps = per_epoch * phase.epochs
        first = provisional_steps(steps) if phase.comm == AUTO else 0
        plans.append(PhasePlan(index=index, comm=phase.comm, size=phase.size, batch_size=phase.batch_size,
                               epochs=phase.epochs, cache_size=recipe.cache_size_of(phase),
                               density=phase.sparse_density, steps_per_epoch=per_epoch, steps=steps,
                               density_warmup_steps=warmup, provisional_steps=first,
                               mean_density=mean_density(phase, start=first, warmup_steps=warmup,
                                                         steps_per_epoch=per_epoch)))
    return plans
