"""Model registry: ``create(name, num_classes=1000, zero_init_residual=False)``.

Example:
    >>> from trainer import models
    >>> net = models.create("resnet_small", num_classes=10)
"""
from __future__ import annotations

from collections.abc import Callable

from torch import nn

from trainer.models.resnet import resnet18, resnet50, resnet_small

__all__ = ["MODELS", "create"]

MODELS: dict[str, Callable[..., nn.Module]] = {
    "resnet50": resnet50,
    "resnet18": resnet18,
    "resnet_small": resnet_small,
}


def create(name: str, num_classes: int = 1000, zero_init_residual: bool = False) -> nn.Module:
    """Build the model registered as ``name``.

    Args:
        name: one of ``MODELS`` (resnet50, resnet18, resnet_small).
        num_classes: classifier outputs (>= 1).
        zero_init_residual: zero the last BN gamma of each residual block.

    Raises:
        ValueError: for an unknown name (the message lists the valid ones) or num_classes < 1.
    """
    try:
        factory = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; valid: {sorted(MODELS)}") from None
    return factory(num_classes=num_classes, zero_init_residual=zero_init_residual)
