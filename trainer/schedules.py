"""Learning-rate schedules as pure functions of progress (epochs, fractional).

Linear warm-up from ``warmup_start * lr`` to ``lr`` over ``warmup_epochs``, then one
decay rule from the ``DECAYS`` registry over the remaining epochs:

- ``poly``:   lr * (1 - t) ** power + final_lr * (1 - (1 - t) ** power)
- ``cosine``: final_lr + (lr - final_lr) * (1 + cos(pi * t)) / 2
- ``step``:   lr * gamma ** (number of milestones <= epoch)
- ``constant``: lr

where ``t`` is the fraction of the post-warm-up epochs elapsed.

NOTE [warm-ups in steps]: a warm-up is counted in optimiser steps. What it protects
(error feedback that holds back gradients while they still change fast; a learning rate
too large for the first steps' curvature) happens per step, while an epoch is as long as
the data set makes it: one epoch of density warm-up is 390 steps of CIFAR-10 at batch
128, but 11 steps of a 1,400-image set, after which the exchange is fully sparse although
error feedback at density ``rho`` delivers an entry only every ~``1 / rho`` steps. Deep
Gradient Compression (Lin et al., ICLR 2018, section 4) warms up over 4 epochs: about
20,000 ImageNet steps, 1,500 CIFAR-10 steps, 3-4 % of its runs. A phase's density
warm-up therefore lasts ``density_warmup_steps`` when given; else
``density_warmup_epochs`` times the phase's steps per epoch when given (recipes written
in epochs keep their meaning on the data they were written for); else
``max(DENSITY_WARMUP_SHARE * phase steps, DENSITY_WARMUP_CYCLES / density)``, at most the
whole phase: an eighth of the run (the one epoch in eight the recipes measured best in
docs/benchmarks/history/train.md, issue 15; about 2.4 % of dense's inter-node bytes over the run at
density 0.01), and never fewer than one and a half delivery cycles of error feedback
(150 steps at density 0.01): on a 156-step CIFAR-10 run, warm-ups of 0.4 and 0.8 cycles
(39 and 78 steps) ended 1.1-2 points below the one over 1.56 cycles (docs/benchmarks/history/train.md,
issue 30). A run shorter than the floor warms up from end to end and spends more bytes
(10.5 % of dense's on that run; the mean density per epoch is in ``metrics.jsonl``). Given steps longer
than the phase, negative values, or epochs and steps together are one-line errors
naming the field. The learning-rate warm-up takes ``schedule.warmup_steps`` or
``schedule.warmup_epochs`` (Goyal et al. give it in epochs, which keep that meaning);
steps are converted with the steps per epoch of the phase being trained.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

__all__ = ["DECAYS", "DENSITY_WARMUP_START", "DENSITY_WARMUP_SHARE", "DENSITY_WARMUP_CYCLES", "density_at",
           "lr_at", "check_warmup_span", "check_warmup_steps", "mean_density", "phase_warmups", "steps_per_epoch",
           "warmup_steps"]

# Deep Gradient Compression's first warm-up density (25 %, then 6.25 %, 1.5625 %, 0.4 %).
DENSITY_WARMUP_START = 0.25
# NOTE [warm-ups in steps]: the density warm-up when a phase gives neither steps nor epochs
DENSITY_WARMUP_SHARE = 0.125
DENSITY_WARMUP_CYCLES = 1.5  # the floor: 1.5 / density steps


def _poly(t: float, epoch: float, lr: float, final_lr: float, power: float, milestones, gamma) -> float:
    return final_lr + (lr - final_lr) * (1.0 - t) ** power


def _cosine(t: float, epoch: float, lr: float, final_lr: float, power, milestones, gamma) -> float:
    return final_lr + (lr - final_lr) * 0.5 * (1.0 + math.cos(math.pi * t))


def _step(t: float, epoch: float, lr: float, final_lr, power, milestones: Sequence[float], gamma: float) -> float:
    return lr * gamma ** sum(1 for m in milestones if epoch >= m)


def _constant(t, epoch, lr, final_lr, power, milestones, gamma) -> float:
    return lr


DECAYS: dict[str, Callable[..., float]] = {"poly": _poly, "cosine": _cosine, "step": _step, "constant": _constant}


def lr_at(epoch: float, *, lr: float, total_epochs: float, warmup_epochs: float = 0.0, warmup_start: float = 0.0,
          decay: str = "cosine", final_lr: float = 0.0, power: float = 2.0,
          milestones: Sequence[float] = (), gamma: float = 0.1) -> float:
    """Learning rate at fractional ``epoch`` (0 <= epoch <= total_epochs).

    Raises:
        ValueError: for an unknown decay name (lists the valid ones) or total_epochs <= 0.

    Example:
        >>> lr_at(0.0, lr=1.0, total_epochs=10, warmup_epochs=2)
        0.0
        >>> lr_at(2.0, lr=1.0, total_epochs=10, warmup_epochs=2, decay="poly")
        1.0
    """
    if decay not in DECAYS:
        raise ValueError(f"unknown decay {decay!r}; valid: {sorted(DECAYS)}")
    if total_epochs <= 0:
        raise ValueError(f"total_epochs must be > 0; got {total_epochs}")
    if epoch < warmup_epochs:
        start = warmup_start * lr
        return start + (lr - start) * epoch / warmup_epochs
    span = max(total_epochs - warmup_epochs, 1e-12)
    t = min(max((epoch - warmup_epochs) / span, 0.0), 1.0)
    return DECAYS[decay](t, epoch, lr, final_lr, power, milestones, gamma)


def check_warmup_span(prefix: str, name: str, epochs: float | None, steps: int | None, most_epochs: float) -> None:
    """A warm-up given in epochs or in steps: not both, not negative, not more epochs than
    ``most_epochs``; a recipe section checks its fields with it. Steps are checked against
    the run's length when it is known (:func:`warmup_steps`).

    Raises:
        ValueError: naming the field (``prefix`` + ``name`` + ``_epochs``/``_steps``).
    """
    if epochs is not None and steps is not None:
        raise ValueError(f"{prefix}{name}_epochs and {name}_steps exclude each other: give the warm-up in epochs "
                         f"or in steps")
    if steps is not None and steps < 0:
        raise ValueError(f"{prefix}{name}_steps must be >= 0; got {steps}")
    if epochs is not None and not 0 <= epochs <= most_epochs:
        raise ValueError(f"{prefix}{name}_epochs must be in [0, {most_epochs:g}] (the epochs it can span); "
                         f"got {epochs}")


def warmup_steps(field: str, *, epochs: float | None, steps: int | None, steps_per_epoch: int, run_steps: int,
                 share: float = 0.0, min_steps: int = 0) -> int:
    """Steps of a warm-up (NOTE [warm-ups in steps]): ``steps`` if given, else ``epochs``
    times ``steps_per_epoch`` if given, else ``max(share * run_steps, min_steps)`` capped
    at ``run_steps``.

    Raises:
        ValueError: naming ``field`` for given steps longer than the run.

    Example:
        >>> warmup_steps("w", epochs=None, steps=None, steps_per_epoch=39, run_steps=156, share=0.125, min_steps=100)
        100
        >>> warmup_steps("w", epochs=1, steps=None, steps_per_epoch=39, run_steps=156)
        39
    """
    if steps is not None:
        if steps > run_steps:
            raise ValueError(f"{field}_steps {steps} is longer than the run it warms up ({run_steps} steps); "
                             f"lower it or give {field}_epochs")
        return int(steps)
    if epochs is not None:
        return round(epochs * steps_per_epoch)
    return min(max(round(share * run_steps), int(min_steps)), run_steps)


def phase_warmups(recipe, index: int, steps_per_epoch: int) -> tuple[int, float]:
    """Phase ``index``'s density warm-up in steps and the learning-rate warm-up in (fractional)
    epochs of ``steps_per_epoch`` steps, resolved from ``recipe`` (a ``trainer.config.Recipe``)
    by NOTE [warm-ups in steps].

    Raises:
        ValueError: naming the field, for warm-up steps longer than what they warm up.
    """
    phase, s = recipe.phases[index], recipe.schedule
    density = warmup_steps(f"phases[{index}].density_warmup", epochs=phase.density_warmup_epochs,
                           steps=phase.density_warmup_steps, steps_per_epoch=steps_per_epoch,
                           run_steps=steps_per_epoch * phase.epochs, share=DENSITY_WARMUP_SHARE,
                           min_steps=math.ceil(DENSITY_WARMUP_CYCLES / phase.sparse_density))
    lr = warmup_steps("schedule.warmup", epochs=s.warmup_epochs, steps=s.warmup_steps, steps_per_epoch=steps_per_epoch,
                      run_steps=steps_per_epoch * recipe.total_epochs)
    return density, lr / steps_per_epoch


def check_warmup_steps(recipe, train_samples: int, world_size: int) -> None:
    """Refuse, before a run starts, warm-up steps longer than what they warm up, with each
    phase's steps per epoch counted as the training loaders deal them (``train_samples //
    world_size`` per rank, full batches).

    Raises:
        ValueError: naming the field (as :func:`warmup_steps`).
    """
    for index, phase in enumerate(recipe.phases):
        phase_warmups(recipe, index, steps_per_epoch(train_samples, world_size, phase.batch_size))


def steps_per_epoch(train_samples: int, world_size: int, batch_size: int) -> int:
    """Steps of an epoch as the training loaders deal them: ``train_samples // world_size``
    samples per rank in full batches (at least 1)."""
    return max(train_samples // world_size // batch_size, 1)


def density_at(step: int, *, density: float, warmup_steps: int = 0, schedule: Sequence[float] = (),
               steps_per_epoch: int = 1) -> float:
    """Density of a sparse exchange at ``step`` (from 0) of its phase (density warm-up).

    ``schedule`` lists the density of each whole epoch of ``steps_per_epoch`` steps (then
    ``density``); otherwise the density decays exponentially from ``DENSITY_WARMUP_START``
    (or ``density`` if that is higher) at step 0 to ``density`` at ``warmup_steps``, per
    step, and stays there. DGC's schedule is ``schedule=(0.25, 0.0625, 0.015625, 0.004)``,
    or ``warmup_steps=4 * steps_per_epoch`` with ``density=0.25 ** 5`` (about 0.1 %)
    sampled at whole epochs. Its inter-node bytes over the warm-up are those of
    ``W * (start - density) / ln(start / density)`` steps at density 1 for ``W`` steps.

    Example:
        >>> density_at(0, density=0.01, warmup_steps=200)
        0.25
        >>> round(density_at(100, density=0.01, warmup_steps=200), 6)
        0.05
        >>> density_at(15, density=0.01, schedule=[0.25, 0.05], steps_per_epoch=10)
        0.05
    """
    if schedule:
        index = step // max(int(steps_per_epoch), 1)
        return float(schedule[index]) if index < len(schedule) else density
    start = max(DENSITY_WARMUP_START, density)
    if step >= warmup_steps:
        return density
    return start * (density / start) ** (step / warmup_steps)


def mean_density(phase, *, start: int, warmup_steps: int, steps_per_epoch: int) -> float:
    """Mean density of ``phase``'s sparse exchange (a ``trainer.config.PhaseConfig``) over its
    steps from ``start`` to its end, as :func:`density_at` gives them: what ``--comm auto``
    prices the sparse candidate at (NOTE [auto exchange] in comm/auto.py).

    Example:
        >>> from trainer.config import PhaseConfig
        >>> round(mean_density(PhaseConfig(epochs=2, comm="hitopk"), start=0, warmup_steps=0, steps_per_epoch=50), 4)
        0.01
    """
    rest = range(start, steps_per_epoch * phase.epochs)
    return sum(density_at(s, density=phase.sparse_density, warmup_steps=warmup_steps, schedule=phase.density_schedule,
                          steps_per_epoch=steps_per_epoch) for s in rest) / max(len(rest), 1)
