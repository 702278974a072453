"""Quality of an approximate top-k: recall and captured energy against the exact top-k."""
from __future__ import annotations

import torch

__all__ = ["recall", "captured_energy"]


def _exact(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    a = x.abs().double()
    return a, torch.topk(a, k, sorted=True).values


def recall(x: torch.Tensor, indices: torch.Tensor, k: int | None = None) -> float:
    """Share of an exact top-k set that ``indices`` also selects, tie-aware.

    Entries strictly above the k-th largest magnitude ``t`` are in every exact top-k
    set; among the entries equal to ``t`` any choice is exact. So recall is
    ``(#selected with |x| > t + min(#selected with |x| == t, k - #{|x| > t})) / k``,
    which equals ``|selected ∩ torch.topk(|x|, k).indices| / k`` whenever ``t`` is unique.

    Args:
        x: the 1-D tensor that was selected from.
        indices: the selected indices.
        k: the size of the exact set (default: ``len(indices)``).

    Returns:
        A float in ``[0, 1]`` (1.0 for ``k == 0``).
    """
    k = indices.numel() if k is None else min(int(k), x.numel())
    if k == 0:
        return 1.0
    a, top = _exact(x, k)
    t = top[-1]
    sel = a[indices.to(x.device)]
    n_above = int((a > t).sum())
    hits = int((sel > t).sum()) + min(int((sel == t).sum()), k - n_above)
    return hits / k


def captured_energy(x: torch.Tensor, indices: torch.Tensor, k: int | None = None) -> float:
    """``||x[indices]||^2 / ||x[exact top-k]||^2`` (1.0 when the exact energy is 0)."""
    k = indices.numel() if k is None else min(int(k), x.numel())
    if k == 0:
        return 1.0
    a, top = _exact(x, k)
    best = float((top**2).sum())
    got = float((a[indices.to(x.device)] ** 2).sum())
    return 1.0 if best == 0.0 else got / best
