"""Parameter counts of the registered models without building them.

NOTE [parameter count table]: ``cachepipe plan`` answers in under 2 s on a 2-core machine
where importing torch takes 1.3-1.8 s of that, and building ``resnet50`` on the CPU another
0.3 s (measured), only to count its parameters. So each model's count is kept here as
the parameters before its classifier plus the classifier's input width (every registered
model ends in one ``Linear``), which gives the count for any number of classes;
``tests/trainer/test_param_counts.py`` builds every model and checks this table against it.

Example:
    >>> param_count("resnet50")
    25557032
    >>> param_count("resnet_small", num_classes=10)
    78042
"""
from __future__ import annotations

from trainer.models import MODELS

__all__ = ["PARAM_COUNTS", "param_count"]

# model -> (parameters before the classifier, the classifier's input features)
PARAM_COUNTS: dict[str, tuple[int, int]] = {
    "resnet50": (23_508_032, 2048),
    "resnet18": (11_176_512, 512),
    "resnet_small": (77_392, 64),
}


def param_count(name: str, num_classes: int = 1000) -> int:
    """Trainable parameters of ``trainer.models.create(name, num_classes)``.

    Raises:
        ValueError: for an unknown model (lists the registered ones) or ``num_classes < 1``.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; valid: {sorted(MODELS)}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    body, features = PARAM_COUNTS[name]
    return body + features * num_classes + num_classes
