"""The Triton kernels of ``mstopk(kernel="gpu")``; the host side is ``mstopk_triton.py``.

Three kernels per call (NOTE [MSTopK GPU kernel] in ``mstopk_triton.py``):

- ``sample_kernel`` (``G`` programs): zeroes the control block and, from a strided
  sample of ``|x|``, each program's q-th largest magnitudes for three target counts
  and its largest one.
- ``filter_kernel`` (persistent programs over tiles of ``x``, the one full read): sum
  and max of ``|x|``, every entry ``>= t_a`` appended to the candidates tile by tile,
  and the entries in ``[t_a, t_b)`` counted in ``W`` bins whose members are kept in
  buckets. The last program to finish (``finalize`` in ``mstopk_finalize.py``) finds the
  (k+1)-th magnitude and the thresholds and writes the summary the host reads.
- ``write_kernel`` (persistent programs over the same tiles, in index order): the kept
  entries and the fill window, placed by a decoupled look-back over the programs.

Magnitudes are compared as the int32 bit patterns of float32 ``|x|`` (monotone for
non-negative floats, immune to flush-to-zero): ``bits >= T`` is ``|x| >= float(T)``.
"""
from __future__ import annotations

import triton
import triton.language as tl

from comm.topk.mstopk_finalize import ABOVE, CAND, GMAX, MAX, N_COUNTERS, SUM, TICKET, finalize, kth_bits

__all__ = ["sample_kernel", "filter_kernel", "write_kernel", "ctrl_layout", "MAX_NUMEL"]

MAX_NUMEL = 1 << 30  # look-back words pack two 30-bit counts: flag << 60 | band << 30 | kept
FLAG_AGG, FLAG_ALL = tl.constexpr(1 << 60), tl.constexpr(2 << 60)
COUNT_MASK, COUNTS = tl.constexpr((1 << 30) - 1), tl.constexpr((1 << 60) - 1)


def ctrl_layout(bins: int, writers: int) -> dict:
    """Offsets (int32 elements) in the control block that ``sample_kernel`` zeroes (hist |
    bmin | bmax | counters | look-back words); ``len`` is its size."""
    counters = 3 * bins
    return dict(hist=0, bmin=bins, bmax=2 * bins, counters=counters, lookback=counters + N_COUNTERS,
                len=counters + N_COUNTERS + 2 * writers)


# Integer arguments are not specialized: Triton turns one equal to 1 into a constant (no
# ``.to()``, a new compile per value pattern); ``STRIDED`` says whether x's stride is not 1.
@triton.jit(do_not_specialize=["n", "stride", "step", "s_g", "ctrl_len", "bmin_lo", "bmin_hi", "q_a", "q_b",
                               "q_deep"])
def sample_kernel(x_ptr, n, stride, step, s_g, out_ptr, ctrl_ptr, ctrl_len, bmin_lo, bmin_hi, q_a, q_b, q_deep,
                  S: tl.constexpr, ZB: tl.constexpr):
    g = tl.program_id(0)
    G = tl.num_programs(0)
    # this program's share of the control block: 0, and INT32_MAX for the bin minima
    per = (ctrl_len + G - 1) // G
    for o in range(0, per, ZB):
        i = g * per + o + tl.arange(0, ZB)
        m = (o + tl.arange(0, ZB) < per) & (i < ctrl_len)
        tl.store(ctrl_ptr + i, tl.where((i >= bmin_lo) & (i < bmin_hi), 0x7FFFFFFF, 0), mask=m)
    # entries (j * G + g) * step, j < s_g: every program sees a stride of the whole of x
    j = tl.arange(0, S)
    pos = (j.to(tl.int64) * G + g) * step
    m = (j < s_g) & (pos < n)
    bits = tl.load(x_ptr + pos * stride, mask=m, other=0.0).to(tl.float32).to(tl.int32, bitcast=True) & 0x7FFFFFFF
    bits = tl.where(m, bits, -1)
    c = tl.arange(0, 4)
    q = tl.where(c == 0, q_a, tl.where(c == 1, q_b, tl.where(c == 2, q_deep, 1)))
    tl.store(out_ptr + g * 4 + c, kth_bits(bits[:, None], q, 15))  # estimates: 8 mantissa bits do


@triton.jit
def _thresholds(sample_ptr, G, explicit_a, explicit_b, b_from_max, W: tl.constexpr, GB: tl.constexpr):
    """``(A, B, sh, deep)``: candidates are ``bits >= A``; ``[A, B)`` is binned ``(bits - A) >> sh``."""
    r = tl.arange(0, GB)
    c = tl.arange(0, 4)
    cols = tl.load(sample_ptr + r[:, None] * 4 + c[None, :], mask=r[:, None] < G, other=-1)
    med = kth_bits(cols, (G + 1) // 2 + c * 0, 15)  # per column, the median over the programs (exact:
    # the sample kernel leaves bits 0-14 clear)
    smax = tl.reduce(tl.reduce(cols, 1, MAX), 0, MAX)
    a = tl.reduce(tl.where(c == 0, med, 0), 0, SUM)
    b = tl.reduce(tl.where(c == 1, med, 0), 0, SUM)
    deep = tl.reduce(tl.where(c == 2, med, 0), 0, SUM)
    b = tl.where((b_from_max != 0) | (b <= a), smax + 1, b)  # b <= a: the sample is mostly zeros
    a = tl.maximum(tl.where(explicit_a >= 0, explicit_a, a), 1)  # 1: the smallest positive float
    b = tl.maximum(tl.where(explicit_b >= 0, explicit_b, b), a + 1)
    span = b - 1 - a
    sh = span * 0
    for _ in range(31):
        sh += ((span >> sh) >= W).to(tl.int32)
    return a, b, sh, tl.maximum(deep, 1)


@triton.jit(do_not_specialize=["n", "stride", "tiles", "per_prog", "G", "explicit_a", "explicit_b", "b_from_max",
                               "cap", "k", "iters", "steps"])
def filter_kernel(x_ptr, n, stride, tiles, per_prog, sample_ptr, G, explicit_a, explicit_b, b_from_max,
                  ctrl_ptr, bucket_ptr, psum_ptr, tile_cnt_ptr, tile_base_ptr, cand_idx_ptr, cand_val_ptr, cap,
                  summary_ptr, k, iters, inv_steps, steps, STRIDED: tl.constexpr, TILE: tl.constexpr,
                  W: tl.constexpr, FB: tl.constexpr, CAP_B: tl.constexpr, GB: tl.constexpr, PB: tl.constexpr):
    pid = tl.program_id(0)
    a_bits, b_bits, sh, deep = _thresholds(sample_ptr, G, explicit_a, explicit_b, b_from_max, W, GB)
    hist, bmin, bmax = ctrl_ptr, ctrl_ptr + W, ctrl_ptr + 2 * W
    counters = ctrl_ptr + 3 * W
    acc = tl.zeros((TILE,), dtype=tl.float64)
    mx = tl.zeros((TILE,), dtype=tl.int32)
    above = tl.zeros((TILE,), dtype=tl.int32)  # per lane: a block reduction per tile costs barriers
    for t in range(pid * per_prog, tl.minimum(pid * per_prog + per_prog, tiles)):
        offs = t * TILE + tl.arange(0, TILE)  # n < 2**30: int32 indices
        inside = offs < n
        if STRIDED:  # 64-bit offsets: offs * stride may pass 2**31 (jit helpers cost the interpreter ~3 ms a call)
            ptrs = x_ptr + offs.to(tl.int64) * stride
        else:
            ptrs = x_ptr + offs
        v = tl.load(ptrs, mask=inside, other=0.0).to(tl.float32)
        bits = v.to(tl.int32, bitcast=True) & 0x7FFFFFFF
        acc += tl.abs(v).to(tl.float64)
        mx = tl.maximum(mx, bits)
        cand = inside & (bits >= a_bits)
        keep = cand.to(tl.int32)
        count = tl.reduce(keep, 0, SUM)
        base = 0
        if count > 0:
            base = tl.atomic_add(counters + CAND, count, sem="relaxed")
        pos = base + tl.associative_scan(keep, 0, SUM) - 1
        ok = cand & (pos < cap)
        tl.store(cand_idx_ptr + pos, offs.to(tl.int32), mask=ok)
        tl.store(cand_val_ptr + pos, v, mask=ok)
        tl.store(tile_cnt_ptr + t, count)
        tl.store(tile_base_ptr + t, base)
        above += (cand & (bits >= b_bits)).to(tl.int32)
        win = cand & (bits < b_bits)
        b = tl.where(win, (bits - a_bits) >> sh, 0)
        slot = tl.atomic_add(hist + b, 1, mask=win, sem="relaxed")
        tl.atomic_xchg(bucket_ptr + b * CAP_B + slot, bits, mask=win & (slot < CAP_B), sem="relaxed")
        tl.atomic_min(bmin + b, bits, mask=win, sem="relaxed")
        tl.atomic_max(bmax + b, bits, mask=win, sem="relaxed")
    tl.atomic_xchg(psum_ptr + pid, tl.reduce(acc, 0, SUM).to(tl.int64, bitcast=True))
    tl.atomic_add(counters + ABOVE, tl.reduce(above, 0, SUM))
    tl.atomic_max(counters + GMAX, tl.reduce(mx, 0, MAX))
    # NOTE [relaxed atomics]: the loop's atomics only need to be atomic. Triton's default,
    # acq_rel, orders each one against every memory access around it; with it this pass took
    # 407 us at 16M entries on an H100 (a read of x takes ~30 us) and grew with the
    # candidates (docs/topk.md). The last program still sees them all: bar.sync orders every
    # thread's atomics before thread 0's acq_rel ticket, which the last program acquires
    # (causality order in the PTX memory model is transitive; CUDA's grid sync relies on it).
    tl.debug_barrier()  # every thread's atomics are issued before the ticket is taken
    if tl.atomic_add(counters + TICKET, 1) == tl.num_programs(0) - 1:  # the last program
        finalize(ctrl_ptr, bucket_ptr, psum_ptr, summary_ptr, n, k, cap, iters, inv_steps, steps,
                 a_bits, b_bits, sh, deep, tl.num_programs(0), W, FB, CAP_B, PB)


@triton.jit
def _lookback(status_ptr, pid):
    """The packed (band, kept) counts of the programs before ``pid`` (decoupled look-back:
    sum the predecessors' aggregates back to the first inclusive prefix)."""
    excl = (pid * 0).to(tl.int64)
    q = pid - 1
    while q >= 0:
        s = tl.load(status_ptr + q, volatile=True)
        while s == 0:
            s = tl.load(status_ptr + q, volatile=True)
        excl += s & COUNTS
        q = tl.where((s >> 60) == 2, -1, q - 1)
    return excl


@triton.jit(do_not_specialize=["n", "stride", "tiles", "per_prog", "lower_bits", "upper_bits", "n_upper", "need",
                               "offset_value"])
def write_kernel(x_ptr, n, stride, tile_cnt_ptr, tile_base_ptr, cand_idx_ptr, cand_val_ptr, tiles, per_prog,
                 status_ptr, lower_bits, upper_bits, n_upper, need, offset_ptr, offset_value, out_idx_ptr,
                 out_val_ptr, OFFSET_ON_DEVICE: tl.constexpr, STRIDED: tl.constexpr, TILE: tl.constexpr,
                 CB: tl.constexpr):
    pid = tl.program_id(0)
    t0 = pid * per_prog
    t1 = tl.minimum(t0 + per_prog, tiles)
    # v = 0 (lower is 0): the band is every entry below upper, zeros included, and its
    # window is taken from x itself below; no candidate is ranked in it
    ranked_from = tl.where(lower_bits == 0, 0x7F800001, lower_bits)
    kept = (pid * 0).to(tl.int64)
    band = (pid * 0).to(tl.int64)
    for t in range(t0, t1):  # pass 1: how many this program keeps and has in the band
        count = tl.load(tile_cnt_ptr + t)
        base = tl.load(tile_base_ptr + t)
        for o in range(0, count, CB):
            j = o + tl.arange(0, CB)
            bits = tl.load(cand_val_ptr + base + j, mask=j < count, other=0.0).to(tl.int32, bitcast=True) & 0x7FFFFFFF
            kept += tl.reduce(((j < count) & (bits >= upper_bits)).to(tl.int64), 0, SUM)
            band += tl.reduce(((j < count) & (bits >= lower_bits) & (bits < upper_bits)).to(tl.int64), 0, SUM)
    mine = kept | (band << 30)
    if pid > 0:
        tl.atomic_xchg(status_ptr + pid, mine | FLAG_AGG)
    excl = _lookback(status_ptr, pid)
    tl.atomic_xchg(status_ptr + pid, (excl + mine) | FLAG_ALL)
    kept = excl & COUNT_MASK
    band = (excl >> 30) & COUNT_MASK
    if OFFSET_ON_DEVICE:
        offset = tl.load(offset_ptr).to(tl.int64)
    else:
        offset = offset_value.to(tl.int64)
    for t in range(t0, t1):  # pass 2: the kept ones, then the window of the band, in index order
        count = tl.load(tile_cnt_ptr + t)
        base = tl.load(tile_base_ptr + t)
        first = t * TILE - kept  # v = 0: the band rank of the tile's first entry
        for o in range(0, count, CB):
            j = o + tl.arange(0, CB)
            inside = j < count
            v = tl.load(cand_val_ptr + base + j, mask=inside, other=0.0)
            idx = tl.load(cand_idx_ptr + base + j, mask=inside, other=0).to(tl.int64)
            bits = v.to(tl.int32, bitcast=True) & 0x7FFFFFFF
            is_kept = inside & (bits >= upper_bits)
            in_band = inside & (bits >= ranked_from) & (bits < upper_bits)
            pos = kept + tl.associative_scan(is_kept.to(tl.int64), 0, SUM) - 1
            tl.store(out_idx_ptr + pos, idx, mask=is_kept)
            tl.store(out_val_ptr + pos, v.to(out_val_ptr.dtype.element_ty), mask=is_kept)
            rank = band + tl.associative_scan(in_band.to(tl.int64), 0, SUM) - 1 - offset
            win = in_band & (rank >= 0) & (rank < need)
            tl.store(out_idx_ptr + n_upper + rank, idx, mask=win)
            tl.store(out_val_ptr + n_upper + rank, v.to(out_val_ptr.dtype.element_ty), mask=win)
            kept += tl.reduce(is_kept.to(tl.int64), 0, SUM)
            band += tl.reduce(in_band.to(tl.int64), 0, SUM)
        last = first + tl.minimum(TILE, n - t * TILE) - (kept - (t * TILE - first))  # one past the tile's band
        if (lower_bits == 0) & (last > offset) & (first < offset + need):  # the window meets the tile: read it
            offs = t * TILE + tl.arange(0, TILE)
            if STRIDED:
                ptrs = x_ptr + offs.to(tl.int64) * stride
            else:
                ptrs = x_ptr + offs
            xv = tl.load(ptrs, mask=offs < n, other=0.0)
            below = (offs < n) & ((xv.to(tl.float32).to(tl.int32, bitcast=True) & 0x7FFFFFFF) < upper_bits)
            rank = first + tl.associative_scan(below.to(tl.int64), 0, SUM) - 1 - offset
            win = below & (rank >= 0) & (rank < need)
            tl.store(out_idx_ptr + n_upper + rank, offs.to(tl.int64), mask=win)
            tl.store(out_val_ptr + n_upper + rank, xv.to(out_val_ptr.dtype.element_ty), mask=win)
