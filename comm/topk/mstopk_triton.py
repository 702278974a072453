"""``mstopk`` on CUDA with fused Triton kernels: three passes over ``x`` in all.

NOTE [MSTopK GPU kernel]: the N counting passes of Algorithm 1 are replaced by one
histogram that counts 2 * 512 candidate thresholds at once:

1. ``_stats_kernel`` reads ``x`` once (any float dtype, converted in registers) and
   writes per-program partial sums (float64) and maxima of ``|x|``.
2. ``_hist_kernel`` reads ``x`` again and bins every ``|x|``: 512 equal bins over
   ``[0, mean)`` and 512 over ``[mean, max]``. Each program accumulates its histogram
   in registers over a contiguous range and adds it to global memory once (integer
   atomics, so the counts are deterministic).
3. On the device, a cumulative sum from the top finds the bin holding the (k+1)-th
   largest magnitude; the cut is the next non-empty bin below it, for margin. One
   host sync reads the candidate count (to allocate) and the statistics (NaN/Inf).
4. ``_compact_kernel`` reads ``x`` a third time and appends every entry whose bin is at
   or above the cut (the same binning code as step 2, so the counts match exactly) to a
   candidate buffer, reserving space with one atomic per block.
5. The candidates (about k plus one bin's worth) are sorted by index and handed to the
   shared finish (``band_from_kth`` + ``select_from_candidates``), exactly as in the
   torch path, so both paths return the same indices for the same generator.

The binning is monotone in ``|x|``, so the candidates are all entries above some value;
if the final band reaches below them (only for tiny ``iters``), the torch compaction
collects it. This module imports triton at import time; ``comm.topk.mstopk`` imports it
only when the kernel is asked for.
"""
from __future__ import annotations

import warnings

import torch
import triton
import triton.language as tl

from comm.topk.checks import check_finite
from comm.topk.mstopk_band import MSTopKBand, band_from_kth, kth_largest, select_from_candidates
from comm.topk.mstopk_torch import candidates, mstopk_torch

__all__ = ["mstopk_gpu", "gpu_candidates", "HALF_BINS"]

HALF_BINS = 512  # bins over [0, mean) and over [mean, max] each (32 per warp lane)
_BLOCK = 4096
_COMPACT_BLOCK = 8192
_WARPS = 8


@triton.jit
def _load_abs(x_ptr, offs, n):
    mask = offs < n
    return tl.abs(tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)), mask


@triton.jit
def _bins(a, mean, scale_lo, scale_hi, H: tl.constexpr):
    # Monotone in a: [0, mean) -> 0..H-1, [mean, max] -> H..2H-1. Clamp in float first so
    # huge ratios never overflow the int conversion.
    lo_f = tl.minimum(a * scale_lo, H - 1.0)
    hi_f = tl.minimum((a - mean) * scale_hi, H - 1.0)
    b = tl.where(a < mean, lo_f.to(tl.int32), H + hi_f.to(tl.int32))
    return tl.minimum(tl.maximum(b, 0), 2 * H - 1)


@triton.jit
def _stats_kernel(x_ptr, n, psum_ptr, pmax_ptr, per_prog, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float64)
    mx = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(per_prog):
        offs = (pid.to(tl.int64) * per_prog + i) * BLOCK + tl.arange(0, BLOCK)
        a, _ = _load_abs(x_ptr, offs, n)
        acc += a.to(tl.float64)
        mx = tl.maximum(mx, a)
    tl.store(psum_ptr + pid, tl.sum(acc, axis=0))
    tl.store(pmax_ptr + pid, tl.max(mx, axis=0))


@triton.jit
def _hist_kernel(x_ptr, n, params_ptr, hist_ptr, per_prog, BLOCK: tl.constexpr, H: tl.constexpr):
    pid = tl.program_id(0)
    mean = tl.load(params_ptr)
    scale_lo = tl.load(params_ptr + 1)
    scale_hi = tl.load(params_ptr + 2)
    hist = tl.zeros((2 * H,), dtype=tl.int32)
    for i in range(per_prog):
        offs = (pid.to(tl.int64) * per_prog + i) * BLOCK + tl.arange(0, BLOCK)
        a, mask = _load_abs(x_ptr, offs, n)
        # Padding lanes go to bin 0; the host subtracts their known number.
        b = tl.where(mask, _bins(a, mean, scale_lo, scale_hi, H), 0)
        hist += tl.histogram(b, 2 * H)
    tl.atomic_add(hist_ptr + tl.arange(0, 2 * H), hist)


@triton.jit
def _compact_kernel(x_ptr, n, params_ptr, cut, cap, counter_ptr, out_idx_ptr, out_val_ptr,
                    BLOCK: tl.constexpr, H: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    a, mask = _load_abs(x_ptr, offs, n)
    b = _bins(a, tl.load(params_ptr), tl.load(params_ptr + 1), tl.load(params_ptr + 2), H)
    keep = (mask & (b >= cut)).to(tl.int32)
    count = tl.sum(keep, axis=0)
    if count > 0:
        base = tl.atomic_add(counter_ptr, count)
        pos = base + tl.cumsum(keep, axis=0) - keep
        ok = (keep > 0) & (pos < cap)  # never write past the buffer, even if counts disagree
        tl.store(out_idx_ptr + pos, offs, mask=ok)
        tl.store(out_val_ptr + pos, a, mask=ok)


def _grid(n: int, device: torch.device) -> tuple[int, int]:
    """(programs, blocks per program) for the looping kernels: about 4 programs per SM."""
    blocks = triton.cdiv(n, _BLOCK)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    per_prog = max(1, triton.cdiv(blocks, 4 * sms))
    return triton.cdiv(blocks, per_prog), per_prog


def gpu_candidates(x: torch.Tensor, k: int) -> tuple | None:
    """Steps 1-4 of NOTE [MSTopK GPU kernel]: ``(cand_idx, cand_val, mean, max, written)``,
    or ``None`` when the cut would keep every entry (the caller uses the torch path).

    ``cand_idx`` is ascending and holds every entry whose bin is at or above the cut; it
    has at least ``k + 1`` entries (``0 < k < numel``). ``written`` is the kernel's
    counter (a 1-element device tensor) that must equal ``len(cand_idx)``.
    """
    n, dev = x.numel(), x.device
    progs, per_prog = _grid(n, dev)
    psum = torch.empty(progs, dtype=torch.float64, device=dev)
    pmax = torch.empty(progs, dtype=torch.float32, device=dev)
    _stats_kernel[(progs,)](x, n, psum, pmax, per_prog, BLOCK=_BLOCK, num_warps=_WARPS)
    total, vmax = psum.sum(), pmax.max()
    mean32 = (total / n).float()
    lo_span, hi_span = mean32.double(), vmax.double() - mean32.double()
    # Scales are finite even for subnormal ranges: an inf scale would turn 0 * inf into
    # NaN and break the monotone binning the candidate set relies on.
    scale = lambda span: torch.where(span > 0, HALF_BINS / span, 0.0).clamp(max=1e30).float()
    params = torch.stack([mean32, scale(lo_span), scale(hi_span)])
    hist = torch.zeros(2 * HALF_BINS, dtype=torch.int32, device=dev)
    _hist_kernel[(progs,)](x, n, params, hist, per_prog, BLOCK=_BLOCK, H=HALF_BINS, num_warps=_WARPS)
    hist[0] -= progs * per_prog * _BLOCK - n  # padding lanes of the last blocks
    above = hist.flip(0).cumsum(0).flip(0)  # above[b] = #entries in bins >= b
    b_star = (above > k).sum() - 1  # highest bin with at least k + 1 entries at or above it
    # Cut at the highest non-empty bin below b_star, so at least one candidate lies below
    # the band and the completeness check in mstopk_gpu passes.
    bins = torch.arange(2 * HALF_BINS, device=dev)
    cut = torch.where((hist > 0) & (bins < b_star), bins, 0).max()
    host = torch.stack([total, vmax.double(), cut.double(), above[cut].double()]).tolist()
    total_h, vmax_h, cut_h, m = host[0], host[1], int(host[2]), int(host[3])
    check_finite(total_h, vmax_h)
    if m == n:
        return None  # every entry would be a candidate (e.g. mostly zeros): see mstopk_gpu
    counter = torch.zeros(1, dtype=torch.int32, device=dev)
    out_idx = torch.empty(m, dtype=torch.int64, device=dev)
    out_val = torch.empty(m, dtype=torch.float32, device=dev)
    _compact_kernel[(triton.cdiv(n, _COMPACT_BLOCK),)](
        x, n, params, cut_h, m, counter, out_idx, out_val,
        BLOCK=_COMPACT_BLOCK, H=HALF_BINS, num_warps=_WARPS)
    order = torch.argsort(out_idx)
    return out_idx[order], out_val[order], total_h / n, vmax_h, counter


def mstopk_gpu(x: torch.Tensor, k: int, iters: int,
               generator: torch.Generator | None) -> tuple[torch.Tensor, MSTopKBand]:
    """Select with the Triton kernels; ``x``: CUDA float16/bfloat16/float32, ``0 < k < numel``.

    Raises:
        ValueError: for NaN/Inf in ``x`` (NOTE [non-finite inputs]).
    """
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"the MSTopK GPU kernel takes float16/bfloat16/float32, got {x.dtype}; "
                         "use kernel='torch'")
    x = x.contiguous()
    found = gpu_candidates(x, k)
    if found is None:
        # The (k+1)-th magnitude sits in the lowest bin, typically 0 in a mostly-zero
        # tensor: the torch path handles that without collecting every entry (NOTE [zero
        # cut] in mstopk_torch) and selects the same indices.
        return mstopk_torch(x, k, iters, generator)
    cand_idx, cand_val, mean, vmax, written = found
    if int(written[0]) != cand_idx.numel():
        # The histogram and the compaction disagree: a Triton miscompilation (tl.histogram
        # has had layout bugs). Never return a wrong selection: warn and use the torch path.
        warnings.warn(f"MSTopK Triton kernels disagree ({int(written[0])} candidates written, "
                      f"{cand_idx.numel()} counted); falling back to kernel='torch'",
                      RuntimeWarning, stacklevel=3)
        return mstopk_torch(x, k, iters, generator)
    cand_min = float(cand_val.min())
    v_next = kth_largest(cand_val, k + 1)
    band = band_from_kth(mean, vmax, v_next, iters, torch.float32)
    if band.lower > 0 and cand_idx.numel() < x.numel() and cand_min >= band.lower:
        # The candidates are all entries above some value, which may lie above the band's
        # lower end (only for tiny iters): collect the band by value instead (rare).
        cand_idx, cand_val = candidates(x, band.lower)
    return select_from_candidates(cand_idx, cand_val, band, k, x.numel(), generator)
