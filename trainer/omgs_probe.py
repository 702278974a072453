"""A probe batch for OMGS planning that leaves no trace on the model (``--comm omgs``,
``omgs_plan: auto``)."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

__all__ = ["probing"]


@contextlib.contextmanager
def probing(model: nn.Module, optimizer: torch.optim.Optimizer, criterion: nn.Module, autocast, *,
            batch_size: int, size: int, num_classes: int, seed: int,
            device: torch.device) -> Iterator[Callable[[], torch.Tensor]]:
    """Yield ``probe() -> loss``: the loss of a random batch of the phase's shape
    (``batch_size`` x 3 x ``size`` x ``size``, labels below ``num_classes``, drawn from
    ``seed``) under ``autocast()``, for the OMGS planner to run backward on.

    On exit the model's buffers (BN statistics) are restored and the gradients cleared,
    so planning leaves no trace on the run.
    """
    g = torch.Generator(device=device).manual_seed(seed)

    def probe() -> torch.Tensor:
        x = torch.randn(batch_size, 3, size, size, generator=g, device=device)
        y = torch.randint(0, num_classes, (batch_size,), generator=g, device=device)
        with autocast():
            return criterion(model(x), y)

    buffers = [b.detach().clone() for b in model.buffers()]
    try:
        yield probe
    finally:
        for b, saved in zip(model.buffers(), buffers):
            b.data.copy_(saved)
        optimizer.zero_grad(set_to_none=True)
