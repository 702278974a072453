"""``mstopk`` as written in Algorithm 1: N counting passes, all state in device tensors.

This is the reference the faster implementations are tested against. Each iteration
is one ``count_nonzero(a >= thres)`` pass and a few ``torch.where`` updates of 0-dim
tensors, so the loop never waits for the device (no ``.item()``); the host syncs once,
after the loop, to size the selected index lists. Two deliberate differences from the
paper's pseudo-code are explained in NOTE [MSTopK fill rule] (``mstopk_band``): the
initial thresholds, and the search range falling back to ``[0, max]`` when the mean
already selects at most k entries.
"""
from __future__ import annotations

import torch

from comm.topk.checks import check_finite, magnitudes
from comm.topk.mstopk_band import MSTopKBand, select_from_candidates
from comm.topk.mstopk_torch import abs_stats

__all__ = ["mstopk_bisect"]


def mstopk_bisect(x: torch.Tensor, k: int, iters: int,
                  generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, MSTopKBand]:
    """Select with the literal N-pass search; ``0 < k < numel``.

    Returns:
        ``(values, indices, band)``.

    Raises:
        ValueError: for NaN/Inf in ``x`` (NOTE [non-finite inputs]).
    """
    a = magnitudes(x)  # line 1
    f64 = dict(dtype=torch.float64, device=a.device)
    mean, vmax = abs_stats(x)  # lines 2-3
    hi = vmax.double()
    n_mean = torch.count_nonzero(a >= mean.to(a.dtype))
    lo = torch.where(n_mean > k, mean, torch.zeros((), **f64))  # NOTE [MSTopK fill rule] (2)
    l, r = torch.zeros((), **f64), torch.ones((), **f64)  # line 4
    k1 = torch.zeros((), dtype=torch.int64, device=a.device)  # line 5
    k2 = torch.full((), a.numel(), dtype=torch.int64, device=a.device)
    thres1 = torch.full((), float("inf"), **f64)  # line 6, NOTE [MSTopK fill rule] (1)
    thres2 = lo.clone()
    for _ in range(iters):  # lines 7-24
        ratio = l + (r - l) / 2
        thres = lo + ratio * (hi - lo)
        nnz = torch.count_nonzero(a >= thres.to(a.dtype))
        below = nnz <= k
        r = torch.where(below, ratio, r)
        l = torch.where(below, l, ratio)
        up1 = below & (nnz > k1)
        k1, thres1 = torch.where(up1, nnz, k1), torch.where(up1, thres, thres1)
        up2 = ~below & (nnz < k2)
        k2, thres2 = torch.where(up2, nnz, k2), torch.where(up2, thres, thres2)
    stats = torch.stack([mean, hi, thres1.to(a.dtype).double(), thres2.to(a.dtype).double(), lo]).tolist()
    check_finite(stats[0], stats[1])
    band = MSTopKBand(lower=stats[3], upper=stats[2], search_lo=stats[4], search_hi=stats[1])
    cand_idx = torch.nonzero(a >= thres2.to(a.dtype)).squeeze(1)  # lines 25-26
    indices, band = select_from_candidates(cand_idx, a[cand_idx], band, k, a.numel(), generator)  # lines 27-29
    return x[indices], indices, band
