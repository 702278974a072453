"""The two MSTopK thresholds and the final selection, shared by every implementation.

NOTE [MSTopK thresholds from the (k+1)-th magnitude]: Algorithm 1 of the MLSys 2021
paper bisects ``ratio`` in ``[0, 1]`` for N iterations, tests ``thres = lo + ratio *
(hi - lo)`` by counting ``nnz = #{|x| >= thres}``, and keeps the tightest threshold
with ``nnz <= k`` (thres1, upper) and the tightest with ``nnz > k`` (thres2, lower).
Every tested point lies on the dyadic grid ``g(j) = lo + j / 2**N * (hi - lo)``, and
``#{|x| >= t} > k`` holds exactly when ``t <= v``, where ``v`` is the (k+1)-th largest
magnitude. So after N iterations the search ends at ``j* = max{j < 2**N : g(j) <= v}``
with ``thres2 = g(j*)`` and ``thres1 = g(j* + 1)`` (``+inf`` if that point is never
tested). ``band_from_kth`` replays the same N-step bisection on ``j`` with that
comparison, computing the grid exactly as the counting passes do (float64, rounded to
the dtype the comparisons run in), so it selects the same sets as the N counting passes
while needing only ``v``, which implementations find with one or two passes over ``x``.
(Algorithm 1 records a new threshold only when the count strictly improves, so its
``thres1``/``thres2`` can be looser grid points than ours, but they select the same
entries.) ``mstopk_bisect`` runs the literal N passes and is the reference the others
are tested against.

NOTE [MSTopK fill rule]: as in the paper, everything ``>= thres1`` is kept and the
remaining ``k - k1`` come from a contiguous window, at a random offset, of the band
``thres2 <= |x| < thres1`` in index order. Two changes make it total: (1) ``thres1``
starts at ``+inf`` and ``thres2`` at the search's lower end (the paper starts both at 0,
which keeps *every* entry when no tested threshold has ``nnz <= k``, and fills from the
whole range below ``thres1`` when none has ``nnz > k``); (2) the search runs over
``[mean, max]`` only when ``#{|x| >= mean} > k``, otherwise over ``[0, max]`` (with the
paper's range the band would then be everything below the first threshold, and the fill
would pick random small entries instead of the largest ones below the mean: mostly-zero
gradients at density 1% hit this). With these the band width is ``(hi - lo) / 2**N``, so
the random fill only chooses among near-ties of the k-th magnitude.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["MSTopKBand", "band_from_kth", "kth_largest", "select_from_candidates", "draw_offset",
           "smallest_positive", "MAX_ITERS"]

MAX_ITERS = 50  # ratio = j / 2**N stays exact in float64 well past this


@dataclass(frozen=True)
class MSTopKBand:
    """Where an MSTopK search ended.

    Attributes:
        lower: thres2; every selected ``|x|`` is ``>= lower``.
        upper: thres1 (``inf`` when never tested); every unselected ``|x|`` is ``<= upper``
            (in fact ``< upper``), every ``|x| >= upper`` is selected.
        search_lo: the lower end of the searched range (the mean of ``|x|``, or 0).
        search_hi: the upper end (the max of ``|x|``).
        n_upper: how many entries are ``>= upper`` (all kept; ``k1`` in the paper).
        n_band: how many entries lie in ``[lower, upper)`` (the fill chooses among them).
    """

    lower: float
    upper: float
    search_lo: float
    search_hi: float
    n_upper: int = 0
    n_band: int = 0


def _rounder(dtype: torch.dtype):
    # Comparisons run in the magnitudes' dtype (float32 for half inputs), so a float64
    # threshold acts as its rounding to that dtype.
    return (lambda v: float(np.float32(v))) if dtype == torch.float32 else float


def band_from_kth(mean: float, vmax: float, v_next: float, iters: int,
                  dtype: torch.dtype = torch.float32) -> MSTopKBand:
    """The thresholds N bisection steps of Algorithm 1 end at; see the NOTE above.

    Args:
        mean: mean of ``|x|`` (float64).
        vmax: max of ``|x|``.
        v_next: the (k+1)-th largest ``|x|`` (needs ``0 < k < numel``).
        iters: N, the number of bisection steps.
        dtype: dtype the comparisons ``|x| >= t`` run in (float32 or float64).
    """
    rnd = _rounder(dtype)
    lo = mean if v_next >= rnd(mean) else 0.0
    span = vmax - lo
    grid = lambda j: rnd(lo + (j / 2.0**iters) * span)  # same float64 ops as the tensor search
    j_lo, j_hi = 0, 2**iters  # g(j_lo) <= v_next always; j_hi is "never tested"
    while j_hi - j_lo > 1:
        mid = (j_lo + j_hi) // 2
        if grid(mid) <= v_next:
            j_lo = mid
        else:
            j_hi = mid
    upper = grid(j_hi) if j_hi < 2**iters else math.inf
    return MSTopKBand(lower=grid(j_lo), upper=upper, search_lo=lo, search_hi=vmax)


def kth_largest(values: torch.Tensor, j: int) -> float:
    """The ``j``-th largest of ``values`` (1-based), from whichever side is shorter."""
    rest = values.numel() - j + 1  # it is also the rest-th smallest
    if rest < j:
        return float(torch.topk(values, rest, largest=False, sorted=False).values.max())
    return float(torch.topk(values, j, sorted=False).values.min())


def smallest_positive(dtype: torch.dtype) -> float:
    """The smallest positive (subnormal) value of ``dtype``: ``|x| >= it`` means ``x != 0``."""
    return float(np.nextafter(np.float32(0), np.float32(1))) if dtype == torch.float32 else 5e-324


def select_from_candidates(cand_idx: torch.Tensor, cand_val: torch.Tensor, band: MSTopKBand, k: int,
                           n: int, generator: torch.Generator | None) -> tuple[torch.Tensor, MSTopKBand]:
    """Keep every candidate ``>= upper`` and fill from the band with a random window.

    Args:
        cand_idx: ascending int64 indices that include every entry with ``|x| >= band.lower``
            (only those ``>= band.upper`` when ``band.lower == 0``).
        cand_val: ``|x|`` at ``cand_idx`` (float32 or float64).
        band: thresholds from ``band_from_kth``.
        k: how many to select (``#{|x| >= lower} >= k`` must hold).
        n: ``x.numel()``.
        generator: draws the window offset (``None``: torch's default CPU generator).

    Returns:
        ``(indices, band)``: ``k`` indices (the kept ones, then the window, each ascending)
        and the band with ``n_upper`` / ``n_band`` filled in.
    """
    upper = torch.tensor(band.upper, dtype=cand_val.dtype, device=cand_val.device)
    above = cand_val >= upper
    kept = cand_idx[above]
    need = k - kept.numel()
    if band.lower > 0:
        band_idx = cand_idx[(cand_val >= band.lower) & ~above]
        n_band = band_idx.numel()
    else:  # the band is every entry not kept: its index list is the complement of `kept`
        band_idx, n_band = None, n - kept.numel()
    if need < 0 or n_band < need:
        raise RuntimeError(f"MSTopK band inconsistent: {kept.numel()} above, {n_band} in band, k={k}")
    # Paper line 27: rand = random(0, len(band) - (k - k1) + 1), an integer in [0, len - need].
    offset = int(draw_offset(n_band - need + 1, generator))
    if band_idx is not None:
        window = band_idx[offset:offset + need]
    else:
        # The r-th entry of the complement of sorted K is r + #{j : K[j] - j <= r}.
        r = torch.arange(offset, offset + need, device=kept.device)
        gaps = kept - torch.arange(kept.numel(), device=kept.device)
        window = r + torch.searchsorted(gaps, r, right=True)
    indices = torch.cat([kept, window])
    return indices, MSTopKBand(band.lower, band.upper, band.search_lo, band.search_hi,
                               n_upper=kept.numel(), n_band=n_band)


def draw_offset(high: int, generator: torch.Generator | None) -> int | torch.Tensor:
    """The fill window's offset, uniform in ``[0, high)`` (paper line 27): a host int from a
    CPU generator (or ``None``: torch's default one), a 1-element tensor on a CUDA
    generator's device (no host sync). Every implementation draws it here, once per call,
    so the same generator gives the same window.
    """
    device = generator.device if generator is not None else torch.device("cpu")
    offset = torch.randint(0, high, (1,), generator=generator, device=device)
    return offset.tolist()[0] if device.type == "cpu" else offset
