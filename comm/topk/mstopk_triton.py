"""``mstopk`` with fused Triton kernels: three passes over ``x``, two host syncs.

NOTE [MSTopK GPU kernel]: the N counting passes of Algorithm 1 are replaced by a radix
select on the bit pattern of ``|x|`` (float32, converted in registers from any float
dtype). For non-negative floats the bit pattern is monotone in the value, so its top
bits are a log-spaced histogram key that needs no range (no mean or max) beforehand:

1. ``_coarse_kernel`` reads ``x`` once: per-program sums (float64) and maxima of ``|x|``,
   and a histogram of the top 11 bits of ``|x|``'s 22-bit key (8 exponent + 3 mantissa
   bits: bins 12.5 % wide relative to their value, on any distribution). Each program
   accumulates in registers over a contiguous range and adds to global memory once
   (integer atomics, so the counts are deterministic).
2. On the device, a cumulative sum from the top gives the coarse bin holding the
   (k+1)-th largest magnitude ``v``; ``_fine_kernel`` reads ``x`` again and histograms
   the next 11 bits of the entries in that bin only (bins 2**-14 of ``v`` wide).
3. Host sync 1 reads the sums, the maximum and both histograms (one transfer). The host
   checks for NaN/Inf, finds the fine bin ``[L, ...)`` holding ``v``, and sets the cut
   at ``band_from_kth(mean, max, L).lower``: the band's lower end is monotone in ``v``,
   so it lies at or above that value and the candidates hold the whole band. The cut is
   usually one fine bin below ``L``, so the candidates are the at most k entries above
   ``v``'s bin, that bin and the one below it. Their number is exact from the histograms
   (the cut is a key, and a key below ``v``'s coarse bin is rounded down to a coarse
   bin; that only happens for tiny ``iters``). If ``v`` is 0 (mostly-zero input), the
   band's lower end is 0 and only the entries ``>= upper`` are needed.
4. ``_compact_kernel`` reads ``x`` a third time and appends every entry whose key is at
   or above the cut (the same key code as steps 1-2, so the counts match exactly) to a
   buffer of exactly that size, reserving space with one atomic per block.
5. On the device: the candidates are sorted by index, ``v`` is their (k+1)-th largest,
   ``_band_kernel`` replays the N bisection steps of ``band_from_kth`` (same float64
   operations, no FMA contraction, the same float32 rounding), and the band counts are
   summed. Host sync 2 reads the compaction counter, the thresholds and the counts (one
   transfer); ``select_from_candidates`` finishes with those counts without another
   sync (NOTE [selection without syncs]; the window offset is drawn on the generator's
   device, as in the torch path, so the indices are the torch path's).

So a call reads ``x`` three times and waits for the device twice (``tests/comm/
test_topk_gpu.py`` counts the reads). Only when every entry is a candidate (the band
may reach zero: tiny ``iters``, subnormal inputs) does the call hand over to the torch
path, which selects the same indices with its own syncs.

NOTE [MSTopK kernel fallback]: the kernels must never end a training run. A compile or
launch error (``_launch``) and a compaction count that differs from the histogram's
(a miscompile: ``tl.histogram`` has had layout bugs) fall back to the torch path with
one ``RuntimeWarning`` per process; ``FALLBACKS`` counts them. NaN/Inf inputs still
raise ``ValueError`` (NOTE [non-finite inputs]).

NOTE [Triton interpreter]: with ``TRITON_INTERPRET=1`` set before triton is imported,
the kernels run in Triton's numpy interpreter on CPU tensors (the tests do this when no
GPU is present). It checks the logic, the masking, the atomics and the counts, not the
speed; ``_grid`` then asks CUDA for nothing. This module imports triton at import time;
``comm.topk.mstopk`` imports it only when the kernel is asked for.
"""
from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

from comm.topk.checks import check_finite
from comm.topk.mstopk_band import MSTopKBand, band_from_kth, select_from_candidates, smallest_positive
from comm.topk.mstopk_torch import mstopk_torch

__all__ = ["mstopk_gpu", "gpu_candidates", "Candidates", "interpreted", "FALLBACKS", "BINS", "KEY_SHIFT",
           "BLOCK", "COMPACT_BLOCK"]

BINS = 2048  # bins per histogram level: 11 bits of the key each
KEY_SHIFT = 9  # key = float32 bits >> 9: 8 exponent + 14 mantissa bits (22 bits, 2 levels)
_WARPS = 8

FALLBACKS = {"count": 0}  # how often this process fell back to the torch path


def interpreted() -> bool:
    """Whether the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` at import)."""
    # triton imports its interpreter module only when TRITON_INTERPRET is set, so on a GPU
    # ``triton.runtime.interpreter`` is not there to look at (seen on an H200, triton 3.6)
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_load_key, InterpretedFunction)


@triton.jit
def _load_key(x_ptr, offs, n, SHIFT: tl.constexpr):
    # |x| in float32 and its key: monotone in |x|, 0 only for zeros.
    mask = offs < n
    a = tl.abs(tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32))
    bits = a.to(tl.int32, bitcast=True)
    key = tl.where(bits > 0, tl.maximum(bits >> SHIFT, 1), 0)
    return a, key, mask


@triton.jit
def _coarse_kernel(x_ptr, n, psum_ptr, pmax_ptr, hist_ptr, per_prog, BLOCK: tl.constexpr,
                   BINS: tl.constexpr, SHIFT: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float64)
    mx = tl.zeros((BLOCK,), dtype=tl.float32)
    hist = tl.zeros((BINS,), dtype=tl.int32)
    for i in range(per_prog):
        offs = (pid.to(tl.int64) * per_prog + i) * BLOCK + tl.arange(0, BLOCK)
        a, key, mask = _load_key(x_ptr, offs, n, SHIFT)
        acc += a.to(tl.float64)
        mx = tl.maximum(mx, a)
        hist += tl.histogram(key // BINS, BINS, mask=mask)
    tl.store(psum_ptr + pid, tl.sum(acc, axis=0))
    tl.store(pmax_ptr + pid, tl.max(mx, axis=0))
    tl.atomic_add(hist_ptr + tl.arange(0, BINS), hist)


@triton.jit
def _fine_kernel(x_ptr, n, coarse_ptr, hist_ptr, per_prog, BLOCK: tl.constexpr, BINS: tl.constexpr,
                 SHIFT: tl.constexpr):
    pid = tl.program_id(0)
    coarse = tl.load(coarse_ptr)
    hist = tl.zeros((BINS,), dtype=tl.int32)
    for i in range(per_prog):
        offs = (pid.to(tl.int64) * per_prog + i) * BLOCK + tl.arange(0, BLOCK)
        _, key, mask = _load_key(x_ptr, offs, n, SHIFT)
        hist += tl.histogram(key % BINS, BINS, mask=mask & (key // BINS == coarse))
    tl.atomic_add(hist_ptr + tl.arange(0, BINS), hist)


@triton.jit
def _compact_kernel(x_ptr, n, cut, cap, counter_ptr, out_idx_ptr, out_val_ptr, BLOCK: tl.constexpr,
                    SHIFT: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    a, key, mask = _load_key(x_ptr, offs, n, SHIFT)
    keep = (mask & (key >= cut)).to(tl.int32)
    count = tl.sum(keep, axis=0)
    if count > 0:
        base = tl.atomic_add(counter_ptr, count)
        pos = base + tl.cumsum(keep, axis=0) - keep
        ok = (keep > 0) & (pos < cap)  # never write past the buffer, even if counts disagree
        tl.store(out_idx_ptr + pos, offs, mask=ok)
        tl.store(out_val_ptr + pos, a, mask=ok)


@triton.jit(do_not_specialize=["iters", "steps"])
def _band_kernel(stats_ptr, out_ptr, iters, inv_steps, steps):
    # band_from_kth (mstopk_band) on the device: stats = [mean, max, v] in float64;
    # out = [lower, upper, search_lo]. Launched without FMA contraction, so every
    # operation rounds as Python's floats do.
    mean = tl.load(stats_ptr)
    vmax = tl.load(stats_ptr + 1)
    v = tl.load(stats_ptr + 2)
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
    tl.store(out_ptr, lower)
    tl.store(out_ptr + 1, tl.where(j_hi < steps, upper, float("inf")))
    tl.store(out_ptr + 2, lo)


# Entries per block of the histogram passes and of the compaction, and programs of the
# histogram passes (None: 4 per SM). The interpreter pays per operation, not per entry,
# so it runs 16x larger blocks (the masking and atomics are the same code).
BLOCK, COMPACT_BLOCK, PROGRAMS = (1 << 16, 1 << 17, 8) if interpreted() else (4096, 8192, None)


class _KernelError(Exception):
    """A Triton kernel failed to compile or launch (NOTE [MSTopK kernel fallback])."""


def _launch(kernel, grid, *args, **meta) -> None:
    try:
        kernel[grid](*args, **meta)
    except Exception as e:  # compiler, assembler, driver: all mean "use the torch path"
        raise _KernelError(f"{type(e).__name__}: {e}") from e


def _grid(n: int, device: torch.device) -> tuple[int, int]:
    """(programs, blocks per program) for the looping kernels: about 4 programs per SM."""
    blocks = triton.cdiv(n, BLOCK)
    programs = PROGRAMS or 4 * torch.cuda.get_device_properties(device).multi_processor_count
    per_prog = max(1, triton.cdiv(blocks, programs))
    return triton.cdiv(blocks, per_prog), per_prog


def _key(value: float) -> int:
    """The key ``_load_key`` computes for ``value`` (float32-representable, >= 0)."""
    bits = int(np.float32(value).view(np.int32))
    return max(bits >> KEY_SHIFT, 1) if bits > 0 else 0


def _key_floor(key: int) -> float:
    """The smallest magnitude with this key."""
    if key <= 1:
        return 0.0 if key == 0 else smallest_positive(torch.float32)
    return float(np.int32(key << KEY_SHIFT).view(np.float32))


def _above(hist: np.ndarray) -> np.ndarray:
    """``above[b]`` = entries in bins ``>= b``; one extra 0 at the end (numpy: a Python loop
    over the 2 x 2048 bins cost 0.6 ms per call, more than the kernels on a small vector)."""
    return np.append(np.cumsum(hist[::-1])[::-1], 0)


class Candidates(NamedTuple):
    """What ``gpu_candidates`` found: the entries at or above the cut, and how it was set."""

    idx: torch.Tensor  # ascending indices of the candidates
    val: torch.Tensor  # their float32 magnitudes
    vmax: float  # max of |x|
    mean_t: torch.Tensor  # mean of |x|, 0-dim float64 on the device
    vmax_t: torch.Tensor  # max of |x|, the same
    v_is_zero: bool  # the (k+1)-th magnitude is 0, so the band's lower end is 0
    written: torch.Tensor  # the compaction counter (0-dim, on the device); must equal len(idx)
    fine_bin: int  # entries in the fine bin holding the (k+1)-th magnitude (0 if it is 0)


def gpu_candidates(x: torch.Tensor, k: int, iters: int) -> Candidates | None:
    """Steps 1-4 of NOTE [MSTopK GPU kernel] (one host sync); ``None`` when every entry
    would be a candidate (the caller uses the torch path). ``x``: contiguous,
    ``0 < k < numel``.

    Raises:
        ValueError: for NaN/Inf in ``x``.
        _KernelError: when a kernel fails to compile or launch.
    """
    n, dev = x.numel(), x.device
    progs, per_prog = _grid(n, dev)
    psum = torch.empty(progs, dtype=torch.float64, device=dev)
    pmax = torch.empty(progs, dtype=torch.float32, device=dev)
    coarse_hist = torch.zeros(BINS, dtype=torch.int32, device=dev)
    _launch(_coarse_kernel, (progs,), x, n, psum, pmax, coarse_hist, per_prog,
            BLOCK=BLOCK, BINS=BINS, SHIFT=KEY_SHIFT, num_warps=_WARPS)
    coarse = ((coarse_hist.flip(0).cumsum(0) > k).sum() - 1).to(torch.int32).reshape(1)  # bin holding v
    fine_hist = torch.zeros(BINS, dtype=torch.int32, device=dev)
    _launch(_fine_kernel, (progs,), x, n, coarse, fine_hist, per_prog,
            BLOCK=BLOCK, BINS=BINS, SHIFT=KEY_SHIFT, num_warps=_WARPS)
    total, vmax = psum.sum(), pmax.max()
    host = np.array(torch.cat([torch.stack([total, vmax.double(), coarse[0].double()]),
                               coarse_hist.double(), fine_hist.double()]).tolist())  # host sync 1
    total_h, vmax_h, b = float(host[0]), float(host[1]), int(host[2])
    check_finite(total_h, vmax_h)
    mean = total_h / n
    above_c = _above(host[3:3 + BINS].astype(np.int64))
    fine = host[3 + BINS:].astype(np.int64)
    above_f = _above(fine)
    f = int(np.flatnonzero(above_c[b + 1] + above_f[:BINS] > k)[-1])  # fine bin holding v
    q_v = b * BINS + f
    if q_v == 0:  # v == 0: the band's lower end is 0; only entries >= upper are needed
        t = band_from_kth(mean, vmax_h, 0.0, iters).upper
    else:  # the band's lower end is monotone in v >= _key_floor(q_v)
        t = max(band_from_kth(mean, vmax_h, _key_floor(q_v), iters).lower, smallest_positive(torch.float32))
    cut = _key(t) if t != float("inf") else BINS * BINS
    if cut // BINS == b:
        m = int(above_c[b + 1] + above_f[cut % BINS])
    else:  # outside v's coarse bin: lower the cut to a coarse bin edge, where counts are known
        cut = cut // BINS * BINS
        m = int(above_c[cut // BINS])
    if m == n:
        return None
    counter = torch.zeros(1, dtype=torch.int32, device=dev)
    out_idx = torch.empty(m, dtype=torch.int64, device=dev)
    out_val = torch.empty(m, dtype=torch.float32, device=dev)
    if m:
        _launch(_compact_kernel, (triton.cdiv(n, COMPACT_BLOCK),), x, n, cut, m, counter, out_idx, out_val,
                BLOCK=COMPACT_BLOCK, SHIFT=KEY_SHIFT, num_warps=_WARPS)
    order = torch.argsort(out_idx)
    return Candidates(out_idx[order], out_val[order], vmax_h, total / n, vmax.double(), q_v == 0, counter[0],
                      int(fine[f]) if q_v else 0)


def _kth_largest(values: torch.Tensor, j: int) -> torch.Tensor:
    """The ``j``-th largest of ``values`` (1-based) as a 0-dim device tensor."""
    rest = values.numel() - j + 1
    if rest < j:
        return torch.topk(values, rest, largest=False, sorted=False).values.max()
    return torch.topk(values, j, sorted=False).values.min()


def _fallback(x, k, iters, generator, why: str):
    FALLBACKS["count"] += 1
    if FALLBACKS["count"] == 1:
        warnings.warn(f"MSTopK Triton kernel: {why}; using kernel='torch' instead "
                      "(warned once per process; NOTE [MSTopK kernel fallback])", RuntimeWarning, stacklevel=4)
    return mstopk_torch(x, k, iters, generator)


def mstopk_gpu(x: torch.Tensor, k: int, iters: int,
               generator: torch.Generator | None) -> tuple[torch.Tensor, MSTopKBand]:
    """Select with the Triton kernels; ``x``: float16/bfloat16/float32 on CUDA (or CPU in
    the interpreter), ``0 < k < numel``. Falls back to the torch path if a kernel fails
    (NOTE [MSTopK kernel fallback]).

    Raises:
        ValueError: for a float64 ``x`` or NaN/Inf in ``x`` (NOTE [non-finite inputs]).
    """
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"the MSTopK GPU kernel takes float16/bfloat16/float32, got {x.dtype}; "
                         "use kernel='torch'")
    x = x.contiguous()
    n = x.numel()
    try:
        found = gpu_candidates(x, k, iters)
        if found is None:
            # Every entry would be a candidate: the torch path handles that without
            # collecting them (NOTE [zero cut] in mstopk_torch) and selects the same indices.
            return mstopk_torch(x, k, iters, generator)
        dev = x.device
        v = torch.zeros((), dtype=torch.float64, device=dev) if found.v_is_zero \
            else _kth_largest(found.val, k + 1).double()
        stats = torch.stack([found.mean_t, found.vmax_t, v])  # on the device: no copy
        out = torch.empty(3, dtype=torch.float64, device=dev)
        _launch(_band_kernel, (1,), stats, out, iters, 2.0**-iters, 2**iters, num_warps=1,
                enable_fp_fusion=False)
    except _KernelError as e:
        return _fallback(x, k, iters, generator, f"a kernel failed ({e})")
    # lower/upper are still on the device: count with them there, then read everything once.
    lower, upper = out[0], out[1]
    val = found.val
    n_upper = (val >= upper).sum()
    n_band = torch.where(lower > 0, ((val >= lower) & (val < upper)).sum(), n - n_upper)
    host = torch.stack([found.written.double(), n_upper.double(), n_band.double(), out[0], out[1], out[2]]
                       ).tolist()  # host sync 2
    written, n_upper_h, n_band_h = int(host[0]), int(host[1]), int(host[2])
    if written != found.idx.numel():
        return _fallback(x, k, iters, generator,
                         f"histogram counted {found.idx.numel()} candidates, compaction wrote {written}")
    band = MSTopKBand(lower=host[3], upper=host[4], search_lo=host[5], search_hi=found.vmax)
    return select_from_candidates(found.idx, val, band, k, n, generator, counts=(n_upper_h, n_band_h))
