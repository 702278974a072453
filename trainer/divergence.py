"""A diverged run stops: one line, whatever the gradient exchange.

NOTE [a diverged run stops]: a NaN or infinite training loss, or gradients that a sparse
exchange's selector finds non-finite (``comm.topk.checks.NonFiniteInput``), end the run
with one line naming the epoch and step and what to change. Without it a dense run
averaged NaN into every rank's weights and trained on to the end with exit 0, while a
sparse one stopped with a message about top-k selection. The loss is checked after
forward, before backward starts any exchange (the value is needed for the epoch's mean
anyway); with fp16 loss scaling the scaler skips such steps instead. Every rank that
diverges raises; the launcher (or torchrun) ends the others.
"""
from __future__ import annotations

import math

import torch

__all__ = ["checked_loss", "diverged"]


def diverged(what: str, epoch: int, step: int) -> str:
    """The one line for a run that diverged at ``epoch`` and global ``step`` (``what``
    says what was found)."""
    return (f"{what} at epoch {epoch}, global step {step}: the run diverged; lower the learning rate (--lr) or "
            f"set optim.clip_norm, then start again or --resume from a checkpoint before it")


def checked_loss(loss: torch.Tensor, epoch: int, step: int) -> float:
    """``loss`` as a float (NOTE [a diverged run stops]).

    Raises:
        ValueError: it is NaN or infinite.
    """
    value = float(loss.detach())
    if not math.isfinite(value):
        raise ValueError(diverged(f"the training loss is {value}", epoch, step))
    return value
