"""Device-side helpers of the MSTopK kernels: order statistics of bit patterns, the
bisection replay of Algorithm 1, and ``finalize``, which the last program of
``filter_kernel`` runs once every tile is counted (``mstopk_kernels.py``).

``finalize`` reads the counts the filter pass left (candidates, entries above the window,
the window's histogram and buckets, per-program sums, the maximum) and writes the summary
the host reads in its one sync: a status, the mean and maximum of ``|x|``, Algorithm 1's
thresholds and how many entries lie above and inside the band. How it finds them, and the
statuses, are in NOTE [MSTopK GPU kernel] in ``mstopk_triton.py``.
"""
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["kth_bits", "band_replay", "finalize", "SUMMARY", "SUMMARY_LEN", "STATUS", "CAND", "ABOVE", "GMAX", "TICKET",
           "N_COUNTERS", "SUM", "MAX"]

# Where each value sits in the float64 summary finalize writes.
SUMMARY = dict(status=0, mean=1, vmax=2, lower=3, upper=4, search_lo=5, n_upper=6, n_band=7, candidates=8,
               fine_bin=9, lower_bits=10, upper_bits=11, retry_a=12, retry_b=13, a_bits=14, b_bits=15)
SUMMARY_LEN = 16
# ok; the sample's cut t_a was above v (low), its t_b at or below v (high), or let through more
# candidates than the buffer holds (cap); v is 0 but the count above upper is not in the bins
# (zero); the band is not inside what was counted (handover); the counts disagree (bad).
STATUS = dict(ok=0, low=1, high=2, cap=3, zero=4, handover=5, bad=6)
INF_BITS = tl.constexpr(0x7F800000)
# Reductions by their combine functions: in Triton's interpreter ``tl.sum`` & co. are jit
# functions whose every call re-patches the language (~3 ms), while ``tl.reduce`` and
# ``tl.associative_scan`` with these run as one numpy call. Loops use these.
SUM, MAX = tl.standard._sum_combine, tl.standard._elementwise_max
# int32 counters after the three W-bin arrays of the control block (mstopk_kernels.ctrl_layout)
CAND, ABOVE, GMAX, TICKET, N_COUNTERS = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2), tl.constexpr(3), 8


@triton.jit
def kth_bits(vals, q, LOW: tl.constexpr = 0):
    """Per column of ``vals`` ([N, C] int32 bit patterns >= 0; -1 is padding), the
    ``q``-th largest ([C]): the largest ``T`` with ``#(vals >= T) >= q``, bit by bit down
    to bit ``LOW`` (the bits below it are 0: with ``LOW = 15``, at most 2**-8 below the value)."""
    res = q * 0
    for i in range(31 - LOW):
        cand = res | (1 << (30 - i))
        count = tl.reduce((vals >= cand[None, :]).to(tl.int32), 0, SUM)
        res = tl.where(count >= q, cand, res)
    return res


@triton.jit
def band_replay(mean, vmax, v, iters, inv_steps, steps):
    """``band_from_kth`` (``mstopk_band.py``) in float64 with float32 rounding of each grid
    point: ``(lower, upper, search_lo)``. The kernel calling it must be launched without
    FMA contraction, so that every operation rounds as Python's floats do."""
    lo = tl.where(v >= mean.to(tl.float32).to(tl.float64), mean, 0.0)
    span = vmax - lo
    j_hi = steps.to(tl.int64)
    j_lo = j_hi * 0
    for _ in range(iters):
        mid = (j_lo + j_hi) // 2
        ok = (lo + (mid.to(tl.float64) * inv_steps) * span).to(tl.float32).to(tl.float64) <= v
        j_lo = tl.where(ok, mid, j_lo)
        j_hi = tl.where(ok, j_hi, mid)
    lower = (lo + (j_lo.to(tl.float64) * inv_steps) * span).to(tl.float32).to(tl.float64)
    upper = (lo + (j_hi.to(tl.float64) * inv_steps) * span).to(tl.float32).to(tl.float64)
    return lower, tl.where(j_hi < steps, upper, float("inf")), lo


@triton.jit
def _walk_bins(hist_ptr, above, k, W: tl.constexpr, FB: tl.constexpr):
    """One walk down the bins, ``FB`` at a time (a finalize holding all ``W`` at once would
    raise the register count of the whole filter kernel): the bin holding the (k+1)-th
    largest, the bin ~1.4 (k + 1) entries deep, and ``above`` plus every bin's count."""
    running = above
    bstar = above * 0 - 1
    deep = above * 0 - 1
    for i in range(W // FB):
        r = W - FB - i * FB + tl.arange(0, FB)
        h = tl.load(hist_ptr + r, volatile=True)
        at_least = running + tl.associative_scan(h, 0, SUM, reverse=True)  # #(bits >= bin r's lower edge)
        bstar = tl.maximum(bstar, tl.reduce(tl.where(at_least >= k + 1, r, -1), 0, MAX))
        deep = tl.maximum(deep, tl.reduce(tl.where(at_least >= (7 * (k + 1)) // 5, r, -1), 0, MAX))
        running += tl.reduce(h, 0, SUM)
    return tl.maximum(bstar, 0), tl.maximum(deep, 0), running


@triton.jit
def _above_bin(hist_ptr, above, b, W: tl.constexpr, FB: tl.constexpr):
    """``#(bits >= the upper edge of bin b)``."""
    total = above
    for i in range(W // FB):
        r = i * FB + tl.arange(0, FB)
        total += tl.reduce(tl.where(r > b, tl.load(hist_ptr + r, volatile=True), 0), 0, SUM)
    return total


@triton.jit
def _bin(ctrl_ptr, bucket_ptr, b, W: tl.constexpr, CAP_B: tl.constexpr):
    """Bin ``b``: its size, its members (padded with -1), its minimum, and whether its
    members are all equal (its minimum is its maximum)."""
    size = tl.load(ctrl_ptr + b, volatile=True)
    s = tl.arange(0, CAP_B)
    vals = tl.load(bucket_ptr + b * CAP_B + s, mask=s < size, other=-1, volatile=True)
    lo = tl.load(ctrl_ptr + W + b, volatile=True)
    return size, vals, lo, lo == tl.load(ctrl_ptr + 2 * W + b, volatile=True)


@triton.jit
def _count_ge(t, a_bits, b_bits, sh, above, ctrl_ptr, bucket_ptr, W: tl.constexpr, FB: tl.constexpr,
              CAP_B: tl.constexpr):
    """``#(bits >= t)`` for ``a_bits <= t``, or -1 where the counts cannot tell."""
    b = tl.minimum(tl.maximum((t - a_bits) >> sh, 0), W - 1)
    size, vals, lo, tied = _bin(ctrl_ptr, bucket_ptr, b, W, CAP_B)
    inside = tl.where(size <= CAP_B, tl.reduce((vals >= t).to(tl.int32), 0, SUM),
                      tl.where(tied, tl.where(lo >= t, size, 0), -1))
    count = tl.where(inside < 0, -1, _above_bin(ctrl_ptr, above, b, W, FB) + inside)
    return tl.where(t >= b_bits, tl.where(t == INF_BITS, 0, -1), count)


@triton.jit
def finalize(ctrl_ptr, bucket_ptr, psum_ptr, summary_ptr, n, k, cap, iters, inv_steps, steps,
             a_bits, b_bits, sh, deep, nprog, W: tl.constexpr, FB: tl.constexpr, CAP_B: tl.constexpr,
             PB: tl.constexpr):
    total = tl.load(ctrl_ptr + 3 * W + CAND, volatile=True)
    above = tl.load(ctrl_ptr + 3 * W + ABOVE, volatile=True)
    gmax = tl.load(ctrl_ptr + 3 * W + GMAX, volatile=True)
    p = tl.arange(0, PB)
    sums = tl.load(psum_ptr + p, mask=p < nprog, other=0, volatile=True).to(tl.float64, bitcast=True)
    mean = tl.reduce(sums, 0, SUM) / n
    vmax = gmax.to(tl.float32, bitcast=True).to(tl.float64)
    # the bin holding v, the (k+1)-th magnitude, and v itself (the j-th largest in it);
    # fewer than k + 1 entries at or above the cut 1 (the smallest positive float): v = 0
    zero = (total <= k) & (a_bits <= 1)
    bstar, b_cap, counted = _walk_bins(ctrl_ptr, above, k, W, FB)
    j = k + 1 - _above_bin(ctrl_ptr, above, bstar, W, FB)
    size, vals, lo, tied = _bin(ctrl_ptr, bucket_ptr, bstar, W, CAP_B)
    v_bits = tl.reduce(kth_bits(vals[:, None], j + tl.zeros((1,), dtype=tl.int32)), 0, SUM)
    v_bits = tl.where(zero, 0, tl.where(size <= CAP_B, v_bits, tl.where(tied, lo, -1)))
    lower, upper, search_lo = band_replay(mean, vmax, v_bits.to(tl.float32, bitcast=True).to(tl.float64),
                                          iters, inv_steps, steps)
    lower_bits = lower.to(tl.float32).to(tl.int32, bitcast=True)
    upper_bits = tl.where(upper == float("inf"), INF_BITS, upper.to(tl.float32).to(tl.int32, bitcast=True))
    count_upper = _count_ge(upper_bits, a_bits, b_bits, sh, above, ctrl_ptr, bucket_ptr, W, FB, CAP_B)
    count_lower = _count_ge(lower_bits, a_bits, b_bits, sh, above, ctrl_ptr, bucket_ptr, W, FB, CAP_B)
    # v = 0: lower is 0 and the band is every entry below upper (NOTE [zero cut] in mstopk_torch)
    n_band = tl.where(zero, n - count_upper, count_lower - count_upper)
    unknown = (count_upper < 0) | (~zero & ((v_bits < 0) | (lower_bits < a_bits) | (count_lower < 0)))
    status = tl.where(unknown, 5, tl.where((count_upper > k) | (n_band < k - count_upper), 6, 0))
    # statuses that a second try fixes, and the cuts it uses (as float32 bit patterns):
    # zero: every nonzero entry binned; low: the sample's deeper cut below, the old cut above;
    # high: the old t_b as the cut, up to the maximum; cap: the bin edge ~1.4 (k + 1) entries deep
    low = (total <= k) & ~zero
    high = (total > k) & (above > k)
    over = (total > k) & (above <= k) & (total > cap)
    retry_a = tl.where(high, b_bits, a_bits + (b_cap << sh))
    retry_a = tl.where(zero, 1, tl.where(low, tl.where(deep < a_bits, deep, 1), retry_a))
    retry_b = tl.where(zero | high, gmax + 1, tl.where(low, a_bits, b_bits))
    status = tl.where(zero & (count_upper < 0), 4, status)
    status = tl.where(low, 1, tl.where(high, 2, tl.where(over, 3, status)))
    status = tl.where(total != counted, 6, status)
    tl.store(summary_ptr + 0, status.to(tl.float64))  # in the order of SUMMARY
    tl.store(summary_ptr + 1, mean)
    tl.store(summary_ptr + 2, vmax)
    tl.store(summary_ptr + 3, lower)
    tl.store(summary_ptr + 4, upper)
    tl.store(summary_ptr + 5, search_lo)
    tl.store(summary_ptr + 6, count_upper.to(tl.float64))
    tl.store(summary_ptr + 7, n_band.to(tl.float64))
    tl.store(summary_ptr + 8, total.to(tl.float64))
    tl.store(summary_ptr + 9, size.to(tl.float64))
    tl.store(summary_ptr + 10, lower_bits.to(tl.float64))
    tl.store(summary_ptr + 11, upper_bits.to(tl.float64))
    tl.store(summary_ptr + 12, retry_a.to(tl.float64))
    tl.store(summary_ptr + 13, retry_b.to(tl.float64))
    tl.store(summary_ptr + 14, a_bits.to(tl.float64))
    tl.store(summary_ptr + 15, b_bits.to(tl.float64))
