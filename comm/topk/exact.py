"""``exact``: the reference selector, ``torch.topk`` on ``|x|``."""
from __future__ import annotations

import torch

__all__ = ["exact_topk"]


def exact_topk(x: torch.Tensor, k: int, **_opts) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k by magnitude of a 1-D tensor.

    Args:
        x: 1-D float tensor (any device, any float dtype).
        k: how many entries to keep; clamped to ``[0, x.numel()]``.

    Returns:
        ``(values, indices)``: the signed values ``x[indices]`` and int64 indices.

    Raises:
        ValueError: if ``x`` is not 1-D or ``k`` is negative.
    """
    if x.dim() != 1:
        raise ValueError(f"top-k selectors take a 1-D tensor, got shape {tuple(x.shape)}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    k = min(int(k), x.numel())
    _, indices = torch.topk(x.abs(), k, sorted=False)
    return x[indices], indices
