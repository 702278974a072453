"""``mstopk`` in portable torch: one sampling step, one selection pass, exact thresholds.

NOTE [MSTopK torch path]: the result of Algorithm 1 depends on ``x`` only through the
mean and max of ``|x|``, the (k+1)-th largest magnitude ``v`` and the entries in the final
band (NOTE [MSTopK thresholds from the (k+1)-th magnitude] in ``mstopk_band``). So:

1. ``a = |x|``; mean and max (two cheap reductions).
2. A strided sample of ``a`` (every s-th entry, no randomness) gives a cut ``t`` that
   about ``1.3 k`` entries exceed: its top-r with r a safe margin above ``k / s``.
3. One pass keeps the candidates ``a >= t`` (``nonzero``). If there are fewer than
   ``k + 1``, the cut is lowered (a deeper rank of the sample, finally 0) and step 3 runs
   again; periodic inputs can fool the sample, but only cost time, never correctness.
4. ``v`` is the (k+1)-th largest candidate; ``band_from_kth`` replays the N bisection
   steps; if the band reaches below ``t`` (possible for tiny ``iters``), step 3 runs again
   with ``t = thres2``. The random fill runs on the candidates.

The search itself is O(N) scalar arithmetic; there is no pass or host sync per
iteration. On CPU, steps 1-3 cost about what reading and writing ``|x|`` once costs,
which is why this path beats ``torch.topk`` (a partial sort of all of ``x``).
"""
from __future__ import annotations

import math

import torch

from comm.topk.checks import check_finite
from comm.topk.mstopk_band import MSTopKBand, band_from_kth, kth_largest, select_from_candidates

__all__ = ["abs_stats", "candidates", "mstopk_torch", "SAMPLE_STRIDE", "CHUNK"]

SAMPLE_STRIDE = 64  # one entry in 64 (one per four cache lines) is read by the sample
CHUNK = 1 << 18  # CPU passes run chunk by chunk so |x| stays in cache (NOTE [CPU chunking])

# NOTE [CPU chunking]: on CPU, materialising |x| for a 16M tensor costs more than the
# reductions that read it (a fresh 64 MB buffer page-faults), so both CPU passes compute
# |x| of 256K entries at a time into one reused buffer and consume it while it is in
# cache. On CUDA the whole tensor is processed at once.


def _chunks(x: torch.Tensor):
    """Yield ``(start, |x[start:start+CHUNK]|)`` with a reused buffer (CPU) or once (CUDA)."""
    if x.is_cuda:
        yield 0, _mag(x)
        return
    buf = torch.empty(min(CHUNK, x.numel()), dtype=_mag_dtype(x.dtype))
    for start in range(0, x.numel(), CHUNK):
        part = x[start:start + CHUNK]
        out = buf[:part.numel()]
        torch.abs(part, out=out) if part.dtype == out.dtype else out.copy_(part).abs_()
        yield start, out


def _mag_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _mag(x: torch.Tensor) -> torch.Tensor:
    return x.abs().to(_mag_dtype(x.dtype))


def abs_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean (float64, 0-dim) and max of ``|x|``, left on ``x``'s device.

    Sums accumulate in float64 on GPUs (so the torch and GPU paths agree to the last bit
    in practice); on CPU each chunk sums in float32 and the chunk sums in float64. Every
    implementation calls this, so they all see the same mean.
    """
    if x.is_cuda:
        a = _mag(x)
        return a.sum(dtype=torch.float64) / x.numel(), a.max()
    sums, maxes = [], []
    for _, a in _chunks(x):
        sums.append(a.sum(dtype=torch.float64) if a.dtype == torch.float64 else a.sum())
        maxes.append(a.max())
    return torch.stack(sums).double().sum() / x.numel(), torch.stack(maxes).max()


def _sample_cut(x: torch.Tensor, k: int, widen: int) -> float:
    """A cut that about ``1.3 (k + 1) * 4**widen`` entries exceed, estimated from a sample."""
    n = x.numel()
    stride = max(1, min(SAMPLE_STRIDE, n // 4096))
    sample = _mag(x[::stride])
    expect = (k + 1) * sample.numel() / n
    rank = math.ceil((1.3 * expect + 4.0 * math.sqrt(expect) + 8) * 4**widen)
    if rank >= sample.numel():
        return 0.0
    return float(torch.topk(sample, rank, sorted=False).values.min())


def candidates(x: torch.Tensor, cut: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Ascending indices of ``|x| >= cut`` and their magnitudes (float32 for half ``x``)."""
    idx, val = [], []
    for start, a in _chunks(x):
        i = torch.nonzero(a >= cut).squeeze(1)
        val.append(a[i])
        idx.append(i + start)
    return torch.cat(idx), torch.cat(val)


def mstopk_torch(x: torch.Tensor, k: int, iters: int,
                 generator: torch.Generator | None) -> tuple[torch.Tensor, MSTopKBand]:
    """Select with the torch path; ``0 < k < numel``.

    Returns:
        ``(indices, band)``; the caller gathers the values.

    Raises:
        ValueError: for NaN/Inf in ``x`` (NOTE [non-finite inputs]).
    """
    mean_t, max_t = abs_stats(x)
    mean, vmax = float(mean_t), float(max_t)
    check_finite(mean, vmax)
    cut = math.inf
    for widen in range(5):  # the last try (cut 0) keeps everything, and k < numel
        cut = 0.0 if widen == 4 else min(cut, _sample_cut(x, k, widen))
        cand_idx, cand_val = candidates(x, cut)
        if cand_idx.numel() > k:
            break
    v_next = kth_largest(cand_val, k + 1)
    band = band_from_kth(mean, vmax, v_next, iters, _mag_dtype(x.dtype))
    if band.lower < cut:  # the band reaches below the candidates: collect it all
        cand_idx, cand_val = candidates(x, band.lower)
    return select_from_candidates(cand_idx, cand_val, band, k, generator)
