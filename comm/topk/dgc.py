"""``dgc``: the sampled-threshold top-k of Deep Gradient Compression (Lin et al., ICLR 2018).

My reading of the scheme (the paper's "sampling" paragraph and its released code), and
the choices made where it leaves room:

1. Sample ``ratio * d`` magnitudes uniformly at random (with replacement; at least
   ``min_samples`` and at most ``d``) using ``generator``.
2. The smallest of the sample's top ``ceil(k * s / d)`` is the threshold estimate: the
   sample's quantile ``1 - k/d``.
3. Select every entry with ``|x| >= threshold`` (one pass).
4. Adjust if the count is off. Too many (the estimate was low): DGC's "hierarchical
   selection" runs an exact top-k on the selected entries only, which is cheap because
   they are few. Too few: the threshold is multiplied by ``lower_factor`` (0.5) and step
   3 is repeated, at most ``max_rounds`` times, after which the threshold drops to 0
   (every entry is a candidate). DGC's code accepts a count within [0.8 k, 1.3 k] and
   truncates; here the count must be exactly ``min(k, numel)`` (the selector contract),
   hence the exact top-k of the candidates.

Because step 4 takes the exact top-k of a superset of the true top-k, the result is the
exact top-k (up to ties); the sampling only decides how much work that takes. The
time is what DGC costs: a gather of the sample, a small top-k, one selection pass, and
a top-k of about ``k`` candidates.
"""
from __future__ import annotations

import math

import torch

from comm.topk.checks import check_args, check_finite, magnitudes, take_all, take_none

__all__ = ["dgc_topk"]


def dgc_topk(x: torch.Tensor, k: int, *, ratio: float = 0.01, min_samples: int = 1024,
             generator: torch.Generator | None = None, lower_factor: float = 0.5,
             max_rounds: int = 4, **_opts) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k by magnitude with DGC's sampled threshold.

    Args:
        x: 1-D float tensor (any float dtype, CPU or CUDA, any strides).
        k: how many entries to keep; clamped to ``[0, x.numel()]``.
        ratio: fraction of ``x`` sampled (default 0.01).
        min_samples: smallest sample (default 1024).
        generator: draws the sample positions (default: the global generator of the
            generator's device, else of ``x``'s device).
        lower_factor: threshold multiplier when too few entries pass (default 0.5).
        max_rounds: lowering rounds before falling back to every entry (default 4).
            Other keyword options are ignored.

    Returns:
        ``(values, indices)``: ``min(k, numel)`` distinct int64 indices and ``x[indices]``.

    Raises:
        ValueError: for a non-1-D or non-float ``x``, ``k < 0``, ``ratio`` outside
            ``(0, 1]``, or NaN/Inf in ``x`` (NOTE [non-finite inputs]).

    Example:
        >>> values, indices = dgc_topk(torch.randn(100_000), 100)
        >>> indices.numel()
        100
    """
    k = check_args(x, k)
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"ratio must be in (0, 1], got {ratio}")
    x, n = x.detach(), x.numel()
    if k == 0:
        return take_none(x)
    if k == n:
        return take_all(x)
    a = magnitudes(x)
    check_finite(float(a.max()))
    s = min(n, max(int(min_samples), math.ceil(ratio * n)))
    device = generator.device if generator is not None else a.device
    pos = torch.randint(0, n, (s,), generator=generator, device=device).to(a.device)
    sample = a[pos]
    threshold = float(torch.topk(sample, max(1, math.ceil(k * s / n)), sorted=False).values.min())
    for _ in range(max_rounds + 1):
        cand = torch.nonzero(a >= threshold).squeeze(1)
        if cand.numel() >= k:
            break
        threshold *= lower_factor
    else:
        cand = torch.arange(n, device=a.device)
    if cand.numel() > k:  # hierarchical selection: exact top-k among the candidates
        cand = cand[torch.topk(a[cand], k, sorted=False).indices]
    return x[cand], cand
