"""``mstopk`` in portable torch: one sampling step, one selection pass, exact thresholds.

NOTE [MSTopK torch path]: the result of Algorithm 1 depends on ``x`` only through the
mean and max of ``|x|``, the (k+1)-th largest magnitude ``v`` and the entries in the final
band (NOTE [MSTopK thresholds from the (k+1)-th magnitude] in ``mstopk_band``). So:

1. A strided sample of ``|x|`` (every s-th entry: s = 64, larger past 4M entries so
   the sample stays <= 64K; no randomness) gives a cut ``t`` that about ``1.3 k``
   entries exceed: its top-r with r a safe margin above ``k / s``.
2. One pass (``scan``) sums ``|x|``, takes its max, and keeps the candidates
   ``|x| >= t`` with their indices. If there are at most ``k``, the cut is lowered (a
   deeper rank of the sample, finally "nonzero", NOTE [zero cut]) and the pass
   repeats: inputs can fool the sample, which only costs time, never correctness.
3. ``v`` is the (k+1)-th largest candidate; ``band_from_kth`` replays the N bisection
   steps; if the band reaches below ``t`` (possible for tiny ``iters``), the pass
   repeats with ``t = thres2``. The random fill runs on the candidates.

The search itself is O(N) scalar arithmetic; there is no pass or host sync per
iteration. On CPU the whole selection is about one read of ``x`` (NOTE [CPU scan]),
which is why this path beats ``torch.topk`` (a partial sort of all of ``x``).
"""
from __future__ import annotations

import contextlib
import math
from typing import NamedTuple

import torch

from comm.topk.checks import check_finite
from comm.topk.mstopk_band import (MSTopKBand, band_from_kth, kth_largest, select_from_candidates,
                                   smallest_positive)

__all__ = ["Scan", "scan", "abs_stats", "candidates", "mstopk_torch", "SAMPLE_STRIDE", "SAMPLE_MAX", "CHUNK",
           "BLOCK", "SCAN_THREADS"]

SAMPLE_STRIDE = 64  # the sample reads at most one entry in 64 ...
SAMPLE_MAX = 1 << 16  # ... and at most 64K entries
CHUNK = 1 << 20  # entries per CPU chunk (4 MiB of float32 stays in L2/L3)
BLOCK = 64  # entries per block whose max decides whether the block is searched

# NOTE [CPU scan]: on CPU, materialising |x| of a 16M tensor costs more than the
# reductions that read it (a fresh 64 MiB buffer page-faults), and a full-size
# ``a >= t`` plus ``nonzero`` costs several times a reduction. So ``scan`` computes |x|
# for 1M entries at a time into one reused buffer and, while it is in cache, sums it
# and takes the max of every block of 64; only the few blocks whose max reaches the cut
# are compared and compacted. Chunks are not smaller because every parallel op ends in
# a barrier, and on an oversubscribed CPU each barrier can wait a whole time slice for
# a descheduled thread. On CUDA the whole tensor is processed at once.
#
# NOTE [single-threaded scan]: the CPU path runs its ops on SCAN_THREADS (1) intra-op
# threads. Each op on a 1M chunk is short enough that, whenever the machine has more
# runnable threads than cores (data-loader workers, gloo, other jobs: the normal state
# of a CPU training box), its closing barrier waits for a descheduled thread, and a
# second thread makes the scan many times slower instead of faster (figures in
# docs/benchmarks/history/decisions.md, "Measurements behind design decisions"; torch.topk itself is
# single-threaded on a 1-D tensor). The scan is memory-bound, so one core loses little on
# a quiet box. ``torch.set_num_threads`` is
# restored afterwards; with OpenMP it only affects the calling thread.
SCAN_THREADS: int | None = 1  # None: use torch's setting


class Scan(NamedTuple):
    """What one pass over ``x`` learns: sum and max of ``|x|``, entries ``|x| >= cut``."""

    total: torch.Tensor  # float64 0-dim
    vmax: torch.Tensor  # 0-dim, magnitude dtype
    idx: torch.Tensor  # ascending int64
    val: torch.Tensor  # |x[idx]|, magnitude dtype


def _mag_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _mag(x: torch.Tensor) -> torch.Tensor:
    return x.abs().to(_mag_dtype(x.dtype))


def scan(x: torch.Tensor, cut: float) -> Scan:
    """One pass over ``x``; ``cut = inf`` collects no candidates (NOTE [CPU scan]).

    Sums accumulate in float64 on GPUs (so the torch and GPU paths agree to the last bit
    in practice); on CPU each chunk sums in the magnitude dtype and the chunk sums in
    float64. Every implementation takes its mean from here, so they all see the same one.
    """
    if x.is_cuda:
        a = _mag(x)
        idx = torch.nonzero(a >= cut).squeeze(1)
        return Scan(a.sum(dtype=torch.float64), a.max(), idx, a[idx])
    with cpu_threads():
        return _scan_cpu(x, cut)


@contextlib.contextmanager
def cpu_threads():
    """Run the CPU work on ``SCAN_THREADS`` intra-op threads (NOTE [single-threaded scan])."""
    threads = torch.get_num_threads()
    if SCAN_THREADS is None or SCAN_THREADS == threads:
        yield
        return
    torch.set_num_threads(SCAN_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _scan_cpu(x: torch.Tensor, cut: float) -> Scan:
    n, dt = x.numel(), _mag_dtype(x.dtype)
    chunk = max(BLOCK, CHUNK // BLOCK * BLOCK)
    buf = torch.empty(min(chunk, -(-n // BLOCK) * BLOCK), dtype=dt)
    sums, maxes, idxs, vals = [], [], [torch.empty(0, dtype=torch.int64)], [buf[:0].clone()]
    for start in range(0, n, chunk):
        part = x[start:start + chunk]
        m = part.numel()
        a = buf[:m]
        torch.abs(part, out=a) if part.dtype == dt else a.copy_(part).abs_()
        blocks = buf[:-(-m // BLOCK) * BLOCK]
        blocks[m:] = -1.0  # padding of the last block: never the max, never selected
        blocks = blocks.view(-1, BLOCK)
        total = a.sum().double()
        if not torch.isfinite(total):  # finite magnitudes near the float32 max overflow
            total = a.sum(dtype=torch.float64)
        sums.append(total)
        bmax = blocks.amax(1)
        maxes.append(bmax.max())
        if cut != math.inf:
            hot = torch.nonzero(bmax >= cut).squeeze(1)
            if hot.numel() * 4 > bmax.numel():  # dense candidates: compare everything
                i = torch.nonzero(a >= cut).squeeze(1)
                idxs.append(start + i)
                vals.append(a[i])
            elif hot.numel():
                rows = blocks[hot]
                rc = torch.nonzero(rows >= cut)
                idxs.append(start + hot[rc[:, 0]] * BLOCK + rc[:, 1])
                vals.append(rows[rc[:, 0], rc[:, 1]])
    return Scan(torch.stack(sums).sum(), torch.stack(maxes).max(), torch.cat(idxs), torch.cat(vals))


def abs_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean (float64, 0-dim) and max of ``|x|``, as every implementation computes them."""
    s = scan(x, math.inf)
    return s.total / x.numel(), s.vmax


def _sample_cut(x: torch.Tensor, k: int, widen: int) -> float:
    """A cut that about ``1.3 (k + 1) * 4**widen`` entries exceed, estimated from a sample."""
    n = x.numel()
    stride = max(1, min(SAMPLE_STRIDE, n // 4096), -(-n // SAMPLE_MAX))
    sample = _mag(x[::stride])
    expect = (k + 1) * sample.numel() / n
    rank = math.ceil((1.3 * expect + 4.0 * math.sqrt(expect) + 8) * 4**widen)
    if rank >= sample.numel():
        return 0.0
    return float(torch.topk(sample, rank, sorted=False).values.min())


def candidates(x: torch.Tensor, cut: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Ascending indices of ``|x| >= cut`` and their magnitudes (float32 for half ``x``)."""
    s = scan(x, cut)
    return s.idx, s.val


def mstopk_torch(x: torch.Tensor, k: int, iters: int,
                 generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, MSTopKBand]:
    """Select with the torch path; ``0 < k < numel``.

    Returns:
        ``(values, indices, band)``.

    Raises:
        ValueError: for NaN/Inf in ``x`` (NOTE [non-finite inputs]).
    """
    if x.is_cuda:
        indices, band = _mstopk_torch(x, k, iters, generator)
    else:
        with cpu_threads():
            indices, band = _mstopk_torch(x, k, iters, generator)
    return x[indices], indices, band


def _mstopk_torch(x: torch.Tensor, k: int, iters: int,
                  generator: torch.Generator | None) -> tuple[torch.Tensor, MSTopKBand]:
    # NOTE [zero cut]: a cut of 0 would make every entry a candidate. Cutting at the
    # smallest positive value instead keeps only nonzero entries; if at most k are nonzero,
    # the (k+1)-th magnitude is 0, the band's lower end is 0, and the band is simply every
    # entry not kept, which select_from_candidates enumerates without candidates.
    tiny = smallest_positive(_mag_dtype(x.dtype))
    cut = max(_sample_cut(x, k, 0), tiny)
    s = scan(x, cut)
    mean, vmax = float(s.total) / x.numel(), float(s.vmax)
    check_finite(mean, vmax)
    for widen in range(1, 5):  # the last try keeps every nonzero entry
        if s.idx.numel() > k or cut == tiny:
            break
        cut = tiny if widen == 4 else max(min(cut, _sample_cut(x, k, widen)), tiny)
        s = scan(x, cut)
    cand_idx, cand_val = s.idx, s.val
    v_next = kth_largest(cand_val, k + 1) if cand_idx.numel() > k else 0.0
    band = band_from_kth(mean, vmax, v_next, iters, _mag_dtype(x.dtype))
    if 0 < band.lower < cut:  # the band reaches below the candidates: collect it all
        cand_idx, cand_val = candidates(x, band.lower)
    return select_from_candidates(cand_idx, cand_val, band, k, x.numel(), generator)
