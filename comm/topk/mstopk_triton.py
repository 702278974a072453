"""``mstopk`` with Triton kernels: one read of ``x``, three kernels, one host sync.

NOTE [MSTopK GPU kernel]: Algorithm 1's result depends on ``x`` only through the mean and
max of ``|x|``, the (k+1)-th largest magnitude ``v`` and the entries near it (NOTE
[MSTopK thresholds from the (k+1)-th magnitude]). The kernels (``mstopk_kernels.py``)
find those while reading ``x`` once:

1. ``sample_kernel`` (at most 32 programs; a strided sample of at most 256K entries and
   1/16 of ``x``): each program's q-th largest magnitudes for three target counts (~1.4
   (k+1), ~0.65 (k+1) and 8x the first) and its maximum; it also zeroes the control
   block. The medians over the programs estimate the cut ``t_a`` (about 1.4 (k+1)
   entries above it) and ``t_b`` (about 0.65 (k+1)), so ``v`` lies in ``[t_a, t_b)`` with
   a 4-sigma margin either way (wider when the sample holds few entries above ``v``).
2. ``filter_kernel`` reads ``x`` once, tile by tile: per-program sums (float64) and the
   maximum of ``|x|``; every entry ``>= t_a`` appended to the candidates (one atomic per
   tile reserves the tile's place; a tile's entries stay in index order, and each tile
   records where they went); the entries ``>= t_b`` counted; those in ``[t_a, t_b)``
   counted in ``W`` bins of their bit patterns, each bin keeping its members (a bucket
   reserved by the bin's counter) and its min and max. The window holds ~0.75 (k+1)
   entries, so only those touch a global atomic, spread over thousands of bins: no hot
   bins, unlike a histogram of all of ``x``. The last program to finish (``finalize``)
   finds the bin holding ``v``, ``v`` itself among that bin's few members (all equal, for
   ties), replays the N bisection steps (``band_from_kth`` in float64), counts the
   entries above and inside the band from the bins, and writes a 16-value summary.
3. The host reads the summary (the one host sync), draws the fill window's offset from
   ``generator`` exactly as the torch path does, and ``write_kernel`` walks the tiles in
   index order, placing the kept entries and the window of the band with a decoupled
   look-back over its programs (each publishes its counts; each sums its predecessors'
   back to the first complete prefix). So the indices are the torch path's, in its order.

When ``v`` is 0 (at most k nonzero entries) the band is every entry below the upper
threshold, zeros included (NOTE [zero cut] in ``mstopk_torch.py``): the write kernel
takes that window from ``x`` itself, reading only the tiles it meets. When the sample
misleads (``v`` below ``t_a`` or at or above ``t_b``, more candidates than the buffer
holds, or ``v = 0`` with the upper threshold outside the bins) the summary says so and
names a corrected cut from what was counted; steps 1-2 run once more (a second read of
``x``, a second sync). When the band is not inside the counted bins (a bucket overflowed
with distinct values, the band reaches below ``t_a``: ``iters`` below ~10, huge tails)
or ``x`` has 2**30 entries or more, the call hands over to the torch path, which selects
the same indices (``HANDOVERS`` counts it).

Why this design: the first kernel (three passes, 2048-bin histograms of all of ``x``)
spent ~0.6 ms per histogram pass at 16M on an H200 where a read took 31 us, and 70
launches per call; radix levels with fewer bins (block-private 8-bit histograms) still
need a pass of ``x`` per level. A sampled cut needs one pass, and the exact (k+1)-th
magnitude then only needs the few entries near it, which the same pass collects in the
window's bins; a separate top-k over the candidates (``torch.topk`` on ~1.4 k entries,
then a sort by index) would cost more launches than this whole call, and the look-back
write gives the index order without a sort.

NOTE [MSTopK GPU cost model] (per call, ``d`` entries of ``b`` bytes, ``M`` ~ 1.4 k
candidates): bytes read from HBM ``d b`` (the filter pass) + the sample (at most 256K
strided entries: 32-byte sectors, <= 8 MiB) + ``2 M * 8`` (the write pass reads the
candidates twice); written: ``M * 8`` candidates, ``k (8 + b)`` output, a few MiB of
buckets and tile records. Launches: 1 allocation (no kernel), 3 Triton kernels, 1
device-to-host copy of the summary, 1 draw of the offset (a CPU op for a CPU generator)
= 6. Host syncs: 1. So at 16M float32 entries the floor is one read pass (~25-30 us on
an H100/H200, where ``torch.topk`` takes ~400 us), plus a sample kernel (~5-10 us: 16
bisection steps over registers), the finalize tail of one program (a few us), the sync
round trip and the relaunch after it (~20-30 us of host latency): about 60-80 us, 5-7x
under ``torch.topk``; at 128M the pass dominates (~200-250 us against ~2.8 ms). The
kernels choose nothing by timing: ``auto`` picks them only where a recorded measurement
says they beat ``torch.topk`` (NOTE [MSTopK kernel choice] in ``kernel_choice.py``).
Timed on an H100 (kernel version 2): the sample kernel and the summary's copy were as
modelled; the filter pass took 13-27x a read and grew with the candidates (suspected:
its atomics, NOTE [relaxed atomics]), the write pass 84-635 us, and the host 0.25-0.6 ms
per call beyond the kernels, not 20-30 us (docs/benchmarks/history/topk.md).

NOTE [MSTopK kernel fallback]: the kernels must never end a training run. A compile or
launch error (``_launch``) and counts that contradict each other (status ``bad``: a
miscompile) fall back to the torch path with one ``RuntimeWarning`` per process;
``FALLBACKS`` counts them. NaN/Inf inputs still raise ``ValueError`` (NOTE [non-finite
inputs]).

NOTE [Triton interpreter]: with ``TRITON_INTERPRET=1`` set before triton is imported,
the kernels run in Triton's numpy interpreter on CPU tensors, one program after the
other (so every look-back finds its predecessors done). It checks the logic, the
masking, the atomics and the counts, not the speed, with larger tiles and fewer programs
than a GPU's; ``_programs`` then asks CUDA for nothing.
"""
from __future__ import annotations

import math
import warnings
from types import SimpleNamespace
from typing import NamedTuple

import torch
import triton

from comm.topk.checks import check_finite
from comm.topk.mstopk_band import MSTopKBand, draw_offset
from comm.topk.mstopk_finalize import STATUS, SUMMARY, SUMMARY_LEN
from comm.topk.mstopk_kernels import MAX_NUMEL, ctrl_layout, filter_kernel, sample_kernel, write_kernel
from comm.topk.mstopk_torch import mstopk_torch

__all__ = ["mstopk_gpu", "read_summary", "Summary", "interpreted", "FALLBACKS", "HANDOVERS", "TILE", "CHUNK"]

FALLBACKS = {"count": 0}  # calls that fell back to the torch path after a failure (warned once)
HANDOVERS = {"count": 0}  # calls the kernels passed to the torch path on purpose (NOTE [MSTopK GPU kernel])
SAMPLE_PROGRAMS, SAMPLE_MAX = 32, 8192  # at most, programs of the sample kernel and entries each samples
CUT, WINDOW_TOP, DEEP = 1.4, 0.65, 8.0  # target counts of t_a, t_b and the deeper cut, in units of k + 1
# (t_a and t_b move further out when the sample holds few entries above v: _plan)


def interpreted() -> bool:
    """Whether the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` at import)."""
    # triton imports its interpreter module only when TRITON_INTERPRET is set, so on a GPU
    # ``triton.runtime.interpreter`` is not there to look at (seen on an H200, triton 3.6)
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(sample_kernel, InterpretedFunction)


# Entries per tile of the filter pass, candidates per step of the write pass, and programs
# of both (None: a multiple of the SM count). The interpreter pays per operation, not per
# entry, so it runs 16x larger tiles (the masking and atomics are the same code).
TILE, CHUNK, FILTER_PROGRAMS, WRITE_PROGRAMS = (1 << 16, 1 << 14, 4, 4) if interpreted() else (4096, 1024, None, None)


class Summary(NamedTuple):
    """What ``finalize`` found (fields in the order of ``mstopk_finalize.SUMMARY``)."""

    status: int
    mean: float
    vmax: float
    lower: float
    upper: float
    search_lo: float
    n_upper: int
    n_band: int
    candidates: int  # entries >= t_a (the candidates collected)
    fine_bin: int  # entries in the bin holding the (k+1)-th magnitude
    lower_bits: int
    upper_bits: int
    retry_a: int  # the cuts a second try uses (status low, high or cap)
    retry_b: int
    a_bits: int
    b_bits: int


class _KernelError(Exception):
    """A Triton kernel failed to compile or launch (NOTE [MSTopK kernel fallback])."""


def _launch(kernel, grid, *args, **meta) -> None:
    try:
        kernel[grid](*args, **meta)
    except Exception as e:  # compiler, assembler, driver: all mean "use the torch path"
        raise _KernelError(f"{type(e).__name__}: {e}") from e


def _programs(tiles: int, fixed: int | None, per_sm: int, device: torch.device) -> tuple[int, int]:
    """(programs, tiles per program) for a persistent kernel over ``tiles`` tiles."""
    want = fixed or per_sm * torch.cuda.get_device_properties(device).multi_processor_count
    per = triton.cdiv(tiles, min(tiles, want))
    return triton.cdiv(tiles, per), per


def _plan(x: torch.Tensor, k: int) -> SimpleNamespace:
    """Sizes of the call's kernels and buffers (plain Python ints)."""
    n = x.numel()
    p = SimpleNamespace(n=n, k=k, tiles=triton.cdiv(n, TILE))
    sample = min(SAMPLE_PROGRAMS * SAMPLE_MAX, max(SAMPLE_MAX, n // 16), n)  # 1/16 of x at most
    p.g = triton.cdiv(sample, SAMPLE_MAX)
    p.s_g = triton.cdiv(sample, p.g)
    p.step = max(1, n // (p.g * p.s_g))
    p.filter_progs, p.filter_per = _programs(p.tiles, FILTER_PROGRAMS, 4, x.device)
    p.write_progs, p.write_per = _programs(p.tiles, WRITE_PROGRAMS, 2, x.device)
    # ~0.75 (k + 1) entries in the window, over half the bins or more: a bucket holds about 3x
    # a bin's mean, and 32. At most 4096 bins: one program walks them (finalize).
    p.bins = triton.next_power_of_2(min(max(256, (k + 1) // 4), 4096))
    p.cap_b = triton.next_power_of_2(int(3 * 1.5 * (k + 1) / p.bins) + 32)
    p.cap = min(n, 2 * (k + 1) + 4096)
    # the sample's ranks: per program, count c of x is c / (g * step) entries; the median
    # of the q-th largest over the programs sits at q - 1/3 of them (order statistics) and
    # is off by ~1.25 / sqrt(its count in the whole sample): the cuts keep 4 of those away
    expected = (k + 1) / p.step  # entries above v in the whole sample
    spread = 4 * 1.25 / math.sqrt(max(expected, 1.0))
    cut, top = max(CUT, 1 + spread), min(WINDOW_TOP, 1 - spread)
    rank = lambda c: round(c * (k + 1) / (p.g * p.step) + 1 / 3)
    p.q_a, p.q_b, p.q_deep = max(2, rank(cut)), rank(top), max(2, rank(cut * DEEP))
    p.b_from_max = int(not 1 <= p.q_b < p.q_a)  # the sample cannot place t_b: use its maximum
    p.q_b = max(1, min(p.q_b, p.q_a - 1))
    p.ctrl = ctrl_layout(p.bins, p.write_progs)
    return p


def _views(p: SimpleNamespace, x: torch.Tensor) -> SimpleNamespace:
    """One allocation for everything the call writes; the outputs are views of it."""
    parts = [("ctrl", torch.int32, p.ctrl["len"]), ("sample", torch.int32, 4 * p.g),
             ("psum", torch.int64, p.filter_progs), ("summary", torch.float64, SUMMARY_LEN),
             ("tile_cnt", torch.int32, p.tiles), ("tile_base", torch.int32, p.tiles),
             ("bucket", torch.int32, p.bins * p.cap_b), ("cand_idx", torch.int32, p.cap),
             ("cand_val", torch.float32, p.cap), ("out_idx", torch.int64, p.k), ("out_val", x.dtype, p.k)]
    offsets, size = [], 0
    for _, dtype, count in parts:
        offsets.append(size)
        size += -(-count * dtype.itemsize // 8) * 8
    ws = torch.empty(size, dtype=torch.uint8, device=x.device)
    views = {name: ws[o:o + count * dtype.itemsize].view(dtype) for (name, dtype, count), o in zip(parts, offsets)}
    look = offsets[0] + 4 * p.ctrl["lookback"]
    views["lookback"] = ws[look:look + 8 * p.write_progs].view(torch.int64)
    return SimpleNamespace(**views)


def read_summary(summary: torch.Tensor) -> Summary:
    """The call's one host sync: copy the summary off the device and read it."""
    host = summary.to("cpu", copy=True).tolist()  # one copy, whatever the device
    return Summary(*(host[i] if name in ("mean", "vmax", "lower", "upper", "search_lo") else int(host[i])
                     for name, i in SUMMARY.items()))


def _count(x: torch.Tensor, p: SimpleNamespace, t: SimpleNamespace, iters: int, cut_a: int, cut_b: int) -> Summary:
    """Steps 1-2 of NOTE [MSTopK GPU kernel] and the sync; ``cut_a``/``cut_b``: explicit
    cuts as float32 bit patterns (-1: from the sample)."""
    ctrl = p.ctrl
    _launch(sample_kernel, (p.g,), x, p.n, x.stride(0), p.step, p.s_g, t.sample, t.ctrl, ctrl["len"], ctrl["bmin"],
            ctrl["bmax"], p.q_a, p.q_b, p.q_deep, S=triton.next_power_of_2(p.s_g), ZB=1024, num_warps=16)
    _launch(filter_kernel, (p.filter_progs,), x, p.n, x.stride(0), p.tiles, p.filter_per, t.sample, p.g, cut_a, cut_b,
            p.b_from_max, t.ctrl, t.bucket, t.psum, t.tile_cnt, t.tile_base, t.cand_idx, t.cand_val, p.cap,
            t.summary, p.k, iters, 2.0**-iters, 2**iters, STRIDED=x.stride(0) != 1, TILE=TILE, W=p.bins,
            FB=min(p.bins, 1024), CAP_B=p.cap_b, GB=triton.next_power_of_2(p.g),
            PB=triton.next_power_of_2(p.filter_progs), num_warps=8, enable_fp_fusion=False)
    return read_summary(t.summary)


def _fallback(x, k, iters, generator, why: str):
    FALLBACKS["count"] += 1
    if FALLBACKS["count"] == 1:
        warnings.warn(f"MSTopK Triton kernel: {why}; using kernel='torch' instead "
                      "(warned once per process; NOTE [MSTopK kernel fallback])", RuntimeWarning, stacklevel=4)
    return mstopk_torch(x, k, iters, generator)


def mstopk_gpu(x: torch.Tensor, k: int, iters: int,
               generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, MSTopKBand]:
    """Select with the Triton kernels; ``x``: 1-D float16/bfloat16/float32 on CUDA (or CPU in
    the interpreter), any stride, ``0 < k < numel``. Returns ``(values, indices, band)``.

    Raises:
        ValueError: for another dtype, or NaN/Inf in ``x`` (NOTE [non-finite inputs]).
    """
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"the MSTopK GPU kernel takes float16/bfloat16/float32, got {x.dtype}; use kernel='torch'")
    if x.numel() >= MAX_NUMEL:
        HANDOVERS["count"] += 1
        return mstopk_torch(x, k, iters, generator)
    p = _plan(x, k)
    t = _views(p, x)
    try:
        s = _count(x, p, t, iters, -1, -1)
        if s.status in (STATUS["low"], STATUS["high"], STATUS["cap"], STATUS["zero"]):  # cut again
            s = _count(x, p, t, iters, s.retry_a, s.retry_b)
    except _KernelError as e:
        return _fallback(x, k, iters, generator, f"a kernel failed ({e})")
    check_finite(s.mean, s.vmax)
    if s.status == STATUS["bad"]:
        return _fallback(x, k, iters, generator, f"its counts disagree ({s})")
    if s.status != STATUS["ok"]:
        HANDOVERS["count"] += 1
        return mstopk_torch(x, k, iters, generator)
    need = k - s.n_upper
    offset = draw_offset(s.n_band - need + 1, generator)  # the torch path's draw, same generator
    on_device = isinstance(offset, torch.Tensor) and offset.device == x.device
    if isinstance(offset, torch.Tensor) and not on_device:
        offset = int(offset)
    try:
        _launch(write_kernel, (p.write_progs,), x, p.n, x.stride(0), t.tile_cnt, t.tile_base, t.cand_idx,
                t.cand_val, p.tiles, p.write_per, t.lookback, s.lower_bits, s.upper_bits, s.n_upper, need,
                offset if on_device else t.summary, 0 if on_device else offset, t.out_idx, t.out_val,
                OFFSET_ON_DEVICE=on_device, STRIDED=x.stride(0) != 1, TILE=TILE, CB=CHUNK, num_warps=4)
    except _KernelError as e:  # the offset is drawn: the torch path draws again (a valid, other window)
        return _fallback(x, k, iters, generator, f"a kernel failed ({e})")
    band = MSTopKBand(lower=s.lower, upper=s.upper if math.isfinite(s.upper) else math.inf, search_lo=s.search_lo,
                      search_hi=s.vmax, n_upper=s.n_upper, n_band=s.n_band)
    return t.out_val, t.out_idx, band
