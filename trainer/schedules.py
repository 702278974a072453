"""Learning-rate schedules as pure functions of progress (epochs, fractional).

Linear warm-up from ``warmup_start * lr`` to ``lr`` over ``warmup_epochs``, then one
decay rule from the ``DECAYS`` registry over the remaining epochs:

- ``poly``:   lr * (1 - t) ** power + final_lr * (1 - (1 - t) ** power)
- ``cosine``: final_lr + (lr - final_lr) * (1 + cos(pi * t)) / 2
- ``step``:   lr * gamma ** (number of milestones <= epoch)
- ``constant``: lr

where ``t`` is the fraction of the post-warm-up epochs elapsed.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

__all__ = ["DECAYS", "DENSITY_WARMUP_START", "density_at", "lr_at"]

# Deep Gradient Compression's first warm-up density (25 %, then 6.25 %, 1.5625 %, 0.4 %).
DENSITY_WARMUP_START = 0.25


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


def density_at(epoch: float, *, density: float, warmup_epochs: float = 0.0,
               schedule: Sequence[float] = ()) -> float:
    """Density of a sparse exchange at fractional ``epoch`` of its phase (density warm-up).

    ``schedule`` lists the density of each whole epoch (then ``density``); otherwise the
    density decays exponentially from ``DENSITY_WARMUP_START`` (or ``density`` if that is
    higher) at epoch 0 to ``density`` at ``warmup_epochs``, continuously per step, and
    stays there. DGC's schedule is ``schedule=(0.25, 0.0625, 0.015625, 0.004)``, or
    ``warmup_epochs=4`` with ``density=0.25 ** 5`` (about 0.1 %) sampled at whole epochs. Its inter-node
    bytes over the warm-up are those of ``W * (start - density) / ln(start / density)``
    epochs at density 1.

    Example:
        >>> density_at(0.0, density=0.01, warmup_epochs=2)
        0.25
        >>> round(density_at(1.0, density=0.01, warmup_epochs=2), 6)
        0.05
        >>> density_at(1.5, density=0.01, schedule=[0.25, 0.05])
        0.05
    """
    if schedule:
        index = int(epoch)
        return float(schedule[index]) if index < len(schedule) else density
    start = max(DENSITY_WARMUP_START, density)
    if epoch >= warmup_epochs:
        return density
    return start * (density / start) ** (epoch / warmup_epochs)
