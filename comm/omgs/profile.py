"""Measure what the OMGS planner needs: per-layer backward times (autograd hooks), the
sparsification cost ``gamma`` and the all-gather costs ``alpha``, ``beta``; save them.
"""
from __future__ import annotations

import json
import math
import os
import secrets
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from comm import collective_ops as ops
from comm.collectives.pairs import pack_pairs
from comm.omgs.model import BYTES_PER_SELECTED, CostModel
from comm.topk.checks import k_for
from comm.topk import get_selector

__all__ = ["BackwardProfile", "measure_backward_times", "fit_gamma", "gamma_from_timings", "fit_sparsify_cost", "fit_alpha_beta",
           "robust_line", "save_profile", "load_profile"]


@dataclass(frozen=True)
class BackwardProfile:
    """Per-layer backward profile in forward order (NOTE [OMGS conventions]).

    ``names[i]``/``tb[i]``/``d[i]`` describe the i-th layer; ``order[i]`` is its index in
    ``model.parameters()`` (forward order here is the reverse of the order in which
    backward produced the gradients, which may differ from the registration order).
    """

    names: list[str]
    tb: list[float]
    d: list[int]
    order: list[int]


def measure_backward_times(model: torch.nn.Module, closure: Callable[[], torch.Tensor],
                           repeats: int = 3, warmup: int = 1, set_to_none: bool = True,
                           statistic: str = "median") -> BackwardProfile:
    """Time each parameter's share of backward with post-accumulate-grad hooks.

    ``tb[i]`` is the time from the previous gradient becoming ready (or from the start of
    ``backward()``) to parameter i's gradient becoming ready: per layer the median over
    ``repeats``, or (``statistic="fastest"``) the layer times of the fastest repeat, a
    consistent least-disturbed measurement on a shared machine.

    Args:
        model: the module; its trainable parameters are the layers.
        closure: runs a forward pass and returns the loss (called once per repeat).
        repeats: timed backward passes (default 3).
        warmup: untimed passes first (default 1).
        set_to_none: how gradients are cleared between passes, as in ``zero_grad``
            (default True); False keeps ``.grad`` allocated, as the training loop may.

    Raises:
        ValueError: if ``repeats < 1``, ``statistic`` is unknown or a parameter never gets
            a gradient.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if statistic not in ("median", "fastest"):
        raise ValueError(f"unknown statistic {statistic!r}; valid: ['fastest', 'median']")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    stamps: dict[int, float] = {}

    def stamp(p: torch.Tensor, i: int) -> None:
        if p.is_cuda:  # the gradient is ready when its kernels are done, not when they are queued
            torch.cuda.synchronize(p.device)
        stamps[i] = time.perf_counter()

    handles = [p.register_post_accumulate_grad_hook(lambda p, i=i: stamp(p, i)) for i, (_, p) in enumerate(named)]
    runs: list[dict[int, float]] = []
    try:
        for r in range(warmup + repeats):
            model.zero_grad(set_to_none=set_to_none)
            loss = closure()
            stamps.clear()
            if loss.is_cuda:
                torch.cuda.synchronize(loss.device)
            start = time.perf_counter()
            loss.backward()
            if len(stamps) != len(named):
                missing = [named[i][0] for i in range(len(named)) if i not in stamps]
                raise ValueError(f"parameters without gradient: {missing[:5]}")
            if r >= warmup:
                ready = sorted(stamps.items(), key=lambda kv: kv[1])
                prev, share = start, {}
                for i, t in ready:
                    share[i] = t - prev
                    prev = t
                runs.append(share)
    finally:
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)
    # forward order = reverse of the readiness order of the last run
    last = sorted(stamps.items(), key=lambda kv: kv[1])
    order = [i for i, _ in reversed(last)]
    if statistic == "fastest":
        fastest = min(runs, key=lambda run: sum(run.values()))
        tb = [fastest[i] for i in order]
    else:
        tb = [statistics.median(run[i] for run in runs) for i in order]
    return BackwardProfile(names=[named[i][0] for i in order], tb=tb,
                           d=[named[i][1].numel() for i in order], order=order)


def gamma_from_timings(sizes: Sequence[int], times: Sequence[float], rho: float) -> float:
    """Least-squares ``gamma`` of ``t = gamma * rho * n * ln n`` through the origin,
    ``gamma = sum(x t) / sum(x^2)`` with ``x = rho n ln n`` (the large groups, where the
    time goes, weigh most). Sizes <= 1 are ignored.

    Raises:
        ValueError: on different lengths or no size larger than 1.
    """
    if len(sizes) != len(times):
        raise ValueError(f"{len(sizes)} sizes but {len(times)} times")
    pts = [(rho * n * math.log(n), t) for n, t in zip(sizes, times) if n > 1]
    if not pts:
        raise ValueError("need at least one size > 1")
    return max(0.0, sum(x * t for x, t in pts) / sum(x * x for x, _ in pts))


def fit_sparsify_cost(sizes: Sequence[int], times: Sequence[float], rho: float) -> tuple[float, float]:
    """Least-squares ``(ts0, gamma)`` of ``t = ts0 + gamma * rho * n * ln n`` (both >= 0):
    the intercept is the fixed per-group overhead that dominates tiny layers.

    Raises:
        ValueError: on different lengths or fewer than two sizes.
    """
    if len(sizes) != len(times) or len(sizes) < 2:
        raise ValueError("need as many times as sizes, and at least two")
    xs = [rho * n * math.log(n) if n > 1 else 0.0 for n in sizes]
    mx, mt = statistics.fmean(xs), statistics.fmean(times)
    sxx = sum((x - mx) ** 2 for x in xs)
    gamma = sum((x - mx) * (t - mt) for x, t in zip(xs, times)) / sxx if sxx > 0 else 0.0
    ts0 = mt - gamma * mx
    if ts0 < 0:
        return 0.0, gamma_from_timings(sizes, times, rho)
    if gamma < 0:
        return mt, 0.0
    return ts0, gamma


def fit_gamma(sizes: Sequence[int], rho: float, selector: str = "exact", repeats: int = 3,
              error_feedback: bool = True, device: torch.device | str = "cpu") -> float:
    """Fit ``gamma`` by timing the engine's compression step for ``topk_ag`` (accumulate,
    top-k, residual update, packing) on flat tensors of each size on ``device``; see
    :func:`gamma_from_timings`. (:class:`comm.GradientExchanger` also records each
    bucket's launch time in ``bucket_compress_s``, to fit from a real run.)

    Raises:
        ValueError: if no size is larger than 1.
    """
    sel = get_selector(selector)
    device = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)  # noqa: E731
    ns, ts = [], []
    for n in sizes:
        if n <= 1:
            continue
        acc, grad = torch.zeros(n, device=device), torch.randn(n, device=device)
        k = k_for(n, rho)
        times = []
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            acc.add_(grad)
            values, indices = sel(acc, k)
            pack_pairs(values, indices, torch.float32, torch.int32)
            if error_feedback:
                acc[indices.long()] = 0.0
            else:
                acc.zero_()
            sync()
            times.append(time.perf_counter() - t0)
        ns.append(n)
        ts.append(statistics.median(times))
    return gamma_from_timings(ns, ts, rho)


def fit_alpha_beta(ks: Sequence[int], topology=None, repeats: int = 5) -> tuple[float, float]:
    """Fit ``t_c = alpha + beta * 8 * k`` by timing the sparse all-gather of ``k`` selected
    entries (``topk_ag``'s packed fp32 values and int32 indices) over the default group,
    on the topology's device (``topology.device``; CPU for None). Collective: every rank
    must call it with the same arguments. Each point is the median over repeats of the
    slowest rank's time; the line is :func:`robust_line` (weighted median of pairwise slopes).

    Raises:
        ValueError: with fewer than two distinct ``k``.
    """
    if len(set(ks)) < 2:
        raise ValueError("need at least two distinct message sizes")
    device = getattr(topology, "device", None) or torch.device("cpu")
    world = dist.get_world_size()
    xs, ts = [], []
    for k in ks:
        send = torch.randn(2 * k, device=device)
        out = torch.empty(world * 2 * k, device=device)
        times = []
        for r in range(repeats + 1):
            ops.barrier()
            t0 = time.perf_counter()
            ops.all_gather_into(out, send, async_op=True).wait()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
            ops.all_reduce(t, op=dist.ReduceOp.MAX)
            if r:  # the first one warms the connections up
                times.append(float(t))
        xs.append(BYTES_PER_SELECTED * k)
        ts.append(statistics.median(times))
    return robust_line(xs, ts)


def robust_line(xs: Sequence[float], ts: Sequence[float]) -> tuple[float, float]:
    """``(alpha, beta) >= 0`` of ``t = alpha + beta * x``: the median of pairwise slopes
    weighted by how far apart the pair's ``x`` are (Sievers-Theil), then the median intercept.

    NOTE [weighted slopes]: plain Theil-Sen (unweighted median of pairwise slopes) is robust
    to the odd slow sample on a shared machine (a least-squares intercept can go negative
    there), but not to many sizes that cost the same: messages up to the emulated link's
    tbf burst all take the latency alone, and the slopes between such nearby sizes are
    latency noise divided by a few bytes, huge and of either sign. They outnumbered the few
    pairs with the large message (21 of 28 pairs in ``bench omgs``), so the median fell on
    noise, and beta came out 0 in one run of two (the planner then saw free bytes). Weighting
    each slope by the pair's distance lets the pairs that span the range decide.
    """
    pairs = sorted(((ts[j] - ts[i]) / (xs[j] - xs[i]), abs(xs[j] - xs[i])) for i in range(len(xs))
                   for j in range(i + 1, len(xs)) if xs[j] != xs[i])
    half, seen, beta = sum(w for _, w in pairs) / 2, 0.0, 0.0
    for slope, weight in pairs:
        seen += weight
        if seen >= half:
            beta = slope
            break
    beta = max(beta, 0.0)
    alpha = max(statistics.median(t - beta * x for x, t in zip(xs, ts)), 0.0)
    return alpha, beta


def save_profile(path: str | os.PathLike, profile: BackwardProfile, cost: CostModel) -> None:
    """Write the profile and costs as JSON, atomically."""
    # NOTE [atomic files] in trainer/atomic_file.py, written here because comm imports torch only.
    path = os.fspath(path)
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "w") as f:
        json.dump({"profile": asdict(profile), "cost": asdict(cost)}, f)
    os.replace(tmp, path)


def load_profile(path: str | os.PathLike) -> tuple[BackwardProfile, CostModel]:
    """Read what :func:`save_profile` wrote (plain JSON, never pickle)."""
    with open(path) as f:
        data = json.load(f)
    return BackwardProfile(**data["profile"]), CostModel(**data["cost"])
