"""Argument checks and trivial cases shared by every top-k selector.

NOTE [non-finite inputs]: ``dgc`` and ``mstopk`` raise ``NonFiniteInput`` (a ``ValueError``) when ``x`` holds a
NaN or an infinity. Both compute a statistic of ``|x|`` anyway (the maximum, or the sum
for the mean), and a NaN or Inf makes that statistic non-finite, so the check costs no
extra pass over ``x``. A gradient with NaN/Inf is a training bug (loss scaling overflow)
that must not be silently sparsified. ``exact`` keeps ``torch.topk``'s behaviour (NaN
counts as the largest magnitude) because it is the cheapest reference. The trainer turns
``NonFiniteInput`` into its one line for a diverged run (NOTE [a diverged run stops] in
``trainer/loop.py``).
"""
from __future__ import annotations

import math

import torch

__all__ = ["NonFiniteInput", "k_for", "check_args", "magnitudes", "take_all", "take_none", "check_finite"]


class NonFiniteInput(ValueError):
    """A selector was given a tensor with NaN or Inf (NOTE [non-finite inputs])."""


def k_for(numel: int, density: float) -> int:
    """Entries a sparse exchange keeps of ``numel``: ``ceil(density * numel)``, at least 1,
    at most ``numel`` (0 of nothing). The one count the collectives, the OMGS cost model and
    the benchmarks share."""
    if numel <= 0:
        return 0
    return max(1, min(numel, math.ceil(float(density) * numel - 1e-9)))


def check_args(x: torch.Tensor, k: int) -> int:
    """Validate a selector's arguments and return the effective ``k = min(k, numel)``.

    Raises:
        ValueError: if ``x`` is not a 1-D floating-point tensor or ``k`` is negative.
    """
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"top-k selectors take a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 1:
        raise ValueError(f"top-k selectors take a 1-D tensor, got shape {tuple(x.shape)}")
    if not x.dtype.is_floating_point:
        raise ValueError(f"top-k selectors take a floating-point tensor, got {x.dtype}")
    k = int(k)
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    return min(k, x.numel())


def magnitudes(x: torch.Tensor) -> torch.Tensor:
    """``|x|`` in float32 for half types (exact), in the input dtype otherwise."""
    a = x.abs()
    return a.float() if a.dtype in (torch.float16, torch.bfloat16) else a


def take_all(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every entry, in index order (the answer when ``k >= numel``)."""
    return x.clone(), torch.arange(x.numel(), device=x.device, dtype=torch.int64)


def take_none(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """No entry (the answer when ``k == 0``)."""
    return x.new_empty(0), torch.empty(0, device=x.device, dtype=torch.int64)


def check_finite(*stats: float) -> None:
    """Raise :class:`NonFiniteInput` if any statistic of ``|x|`` is NaN or infinite.

    See NOTE [non-finite inputs].
    """
    if not all(math.isfinite(s) for s in stats):
        raise NonFiniteInput("x contains NaN or Inf; top-k selection of a non-finite tensor is refused "
                         "(see NOTE [non-finite inputs] in comm/topk/checks.py)")
