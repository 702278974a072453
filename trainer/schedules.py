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

__all__ = ["DECAYS", "lr_at"]


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
