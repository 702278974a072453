"""``mstopk``: the approximate top-k of Algorithm 1 (MLSys 2021), three implementations.

Algorithm 1 bisects a threshold between the mean and the max of ``|x|`` for N
iterations, keeps every entry above the tightest threshold that selects at most k
(``thres1``), and fills the rest with a random contiguous window of the band between
``thres1`` and the tightest threshold that selects more than k (``thres2``). The
implementations, chosen by ``kernel``, return the same indices for the same generator:

- ``"torch"``: portable; finds the (k+1)-th magnitude from a sample and one selection
  pass, then replays the N bisection steps on scalars (NOTE [MSTopK torch path]).
- ``"bisect"``: the literal N counting passes in device tensors, no host sync in the
  loop; the reference the others are tested against.
- ``"gpu"``: Triton kernels, one read of ``x``, three kernels and one host sync (NOTE
  [MSTopK GPU kernel] in ``mstopk_triton.py``); CUDA tensors, or CPU tensors when
  ``TRITON_INTERPRET=1`` runs the kernels in Triton's interpreter (NOTE [Triton
  interpreter]). A kernel that fails to compile or launch falls back to ``"torch"`` with
  one warning per process (NOTE [MSTopK kernel fallback]).
- ``"auto"``: ``"torch"`` on CPU; on CUDA ``"gpu"`` where a recorded measurement on that
  device class says it beats ``torch.topk``, else ``"torch"`` (NOTE [MSTopK kernel choice]
  in ``kernel_choice.py``).

See NOTE [MSTopK thresholds from the (k+1)-th magnitude] and NOTE [MSTopK fill rule] in
``comm/topk/mstopk_band.py`` for why the implementations agree and how the fill differs
from the paper's pseudo-code.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import warnings
from typing import NamedTuple

import torch

from comm.topk.checks import check_args, take_all, take_none
from comm.topk.kernel_choice import kernel_beats_topk
from comm.topk.mstopk_band import MAX_ITERS, MSTopKBand
from comm.topk.mstopk_bisect import mstopk_bisect
from comm.topk.mstopk_torch import mstopk_torch

__all__ = ["mstopk", "mstopk_select", "mstopk_thresholds", "MSTopKResult", "KERNELS",
           "gpu_kernel_available", "interpreter_enabled", "resolve_kernel"]


@functools.lru_cache(maxsize=1)
def _gpu_impl():
    try:
        from comm.topk.mstopk_triton import mstopk_gpu  # NOTE: imports triton
    except Exception as e:  # a broken triton install must not end a training run
        warnings.warn(f"MSTopK Triton kernel unavailable ({type(e).__name__}: {e}); using kernel='torch' "
                      "(NOTE [MSTopK kernel fallback])", RuntimeWarning, stacklevel=4)
        return mstopk_torch
    return mstopk_gpu


def _gpu(*args):
    return _gpu_impl()(*args)


# name -> fn(x, k, iters, generator) -> (values, indices, band); "auto" is resolved first.
KERNELS = {"torch": mstopk_torch, "bisect": mstopk_bisect, "gpu": _gpu}


class MSTopKResult(NamedTuple):
    """``mstopk_select``'s answer: the selection and the thresholds that produced it."""

    values: torch.Tensor
    indices: torch.Tensor
    band: MSTopKBand | None  # None when k == 0 or k >= numel (no search ran)


@functools.lru_cache(maxsize=1)
def gpu_kernel_available() -> bool:
    """Whether the Triton kernel can run on CUDA here: CUDA present and ``triton`` installed."""
    return torch.cuda.is_available() and importlib.util.find_spec("triton") is not None


def interpreter_enabled() -> bool:
    """Whether ``kernel="gpu"`` takes CPU tensors: ``TRITON_INTERPRET=1`` and triton installed."""
    return os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None


_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def resolve_kernel(kernel: str, x: torch.Tensor, k: int) -> str:
    """The implementation ``kernel`` means for selecting ``k`` of ``x`` (``"auto"`` resolved).

    Raises:
        ValueError: for an unknown name (the message lists the valid ones), or ``"gpu"``
            for a tensor or machine the kernel cannot serve.
    """
    if kernel == "auto":  # NOTE [MSTopK kernel choice]
        fast = (x.is_cuda and x.dtype in _KERNEL_DTYPES and 0 < k < x.numel() and gpu_kernel_available()
                and kernel_beats_topk(x.device, x.numel(), k))
        return "gpu" if fast else "torch"
    if kernel not in KERNELS:
        raise ValueError(f"unknown mstopk kernel {kernel!r}; valid: {['auto'] + sorted(KERNELS)}")
    if kernel == "gpu" and not (gpu_kernel_available() if x.is_cuda else
                                (x.device.type == "cpu" and interpreter_enabled())):
        raise ValueError("kernel='gpu' needs a CUDA tensor and Triton (pip install triton), or a CPU "
                         "tensor with TRITON_INTERPRET=1; use kernel='torch' or 'auto'")
    return kernel


def mstopk_select(x: torch.Tensor, k: int, *, iters: int = 30, generator: torch.Generator | None = None,
                  kernel: str = "auto", **_opts) -> MSTopKResult:
    """MSTopK that also returns the thresholds (for tests and diagnostics).

    Args and Raises: as ``mstopk``.

    Example:
        >>> res = mstopk_select(torch.randn(10_000), 10)
        >>> bool((res.values.abs() >= res.band.lower).all())
        True
    """
    k = check_args(x, k)
    x = x.detach()  # selection is not differentiable; values come back detached
    if not 0 <= int(iters) <= MAX_ITERS:
        raise ValueError(f"iters must be in [0, {MAX_ITERS}], got {iters}")
    name = resolve_kernel(kernel, x, k)
    if k == 0:
        return MSTopKResult(*take_none(x), None)
    if k == x.numel():
        return MSTopKResult(*take_all(x), None)
    return MSTopKResult(*KERNELS[name](x, k, int(iters), generator))


def mstopk(x: torch.Tensor, k: int, *, iters: int = 30, generator: torch.Generator | None = None,
           kernel: str = "auto", **_opts) -> tuple[torch.Tensor, torch.Tensor]:
    """Approximate top-k by magnitude of a 1-D tensor (Algorithm 1 of the MLSys 2021 paper).

    Args:
        x: 1-D float tensor (float16/bfloat16/float32/float64, CPU or CUDA, any strides).
        k: how many entries to keep; clamped to ``[0, x.numel()]``.
        iters: N, bisection steps of the threshold search (default 30, as in the paper).
        generator: draws the offset of the random fill window (default: torch's global
            CPU generator). A seeded generator makes the result deterministic.
        kernel: ``"auto"`` (default), ``"torch"``, ``"bisect"`` or ``"gpu"``; see the module
            docstring. Other keyword options are ignored.

    Returns:
        ``(values, indices)``: exactly ``min(k, numel)`` distinct int64 indices (those
        above the upper threshold first, then the fill, each ascending) and ``x[indices]``.

    Raises:
        ValueError: if ``x`` is not a 1-D float tensor, ``k < 0``, ``iters`` is outside
            ``[0, 50]``, ``kernel`` is unknown or unavailable, or ``x`` holds NaN/Inf
            (NOTE [non-finite inputs] in ``comm/topk/checks.py``).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> values, indices = mstopk(torch.randn(1_000_000), 1000, generator=g)
        >>> indices.numel()
        1000
    """
    values, indices, _ = mstopk_select(x, k, iters=iters, generator=generator, kernel=kernel)
    return values, indices


def mstopk_thresholds(x: torch.Tensor, k: int, **opts) -> tuple[float, float]:
    """``(lower, upper)`` thresholds of an ``mstopk`` call with the same arguments.

    Every selected ``|x|`` is ``>= lower``; every unselected one is ``<= upper``. For
    ``k == 0`` this is ``(inf, inf)``; for ``k >= numel`` ``(0, 0)``.
    """
    band = mstopk_select(x, k, **opts).band
    if band is None:
        inf = float("inf")
        return (inf, inf) if check_args(x, k) == 0 else (0.0, 0.0)
    return band.lower, band.upper
