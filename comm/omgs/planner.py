"""Merged-layer planners: the paper's greedy FindMergedLayers and an exact optimum.

Conventions (forward-order lists, ``merged[i]`` joins layer i to layer ``i - 1``) are in
NOTE [OMGS conventions] in ``comm/omgs/model.py``.
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import torch

from comm.omgs.model import BYTES_PER_SELECTED, CostModel, plan_from_groups, simulate, validate_profile

__all__ = ["PLANNERS", "find_merged_layers", "lags_plan", "single_bucket_plan", "threshold_plan"]


def _paper_plan(tb: Sequence[float], d: Sequence[int], cost: CostModel, tf: float) -> list[bool]:
    """Algorithm 1 (FindMergedLayers), O(L^2), transcribed with 0-based forward indices.

    NOTE [paper planner fidelity]
    Lines 2-13 are followed literally: the scan goes from the last layer down to the
    second, Q3 compares ``u + t_s(d_l) + t_s(d_{l-1})`` with ``tau_c[l] + t_c(d_l)`` and
    Q5 compares ``tau_c[l] + alpha`` with ``u + t_s(d_l + d_{l-1})``, where
    ``u = tau_b[l] + tb[l] + tb[l-1]``; after a merge the start times of layers ``<= l``
    and all communication start times are recomputed. One fix to the pseudo-code: in
    CalculateCommStart a merged layer (size 0) gets ``t_c = 0`` (eq. 13) instead of
    ``AGPM(0) = alpha``, and ``t_s(0) = 0``. Costs use the byte convention of the model.
    """
    n = len(tb)
    tb, d = [float(t) for t in tb], [int(x) for x in d]
    merged = [False] * n
    ts = lambda size: cost.sparsify_time(size) if size > 0 else 0.0  # noqa: E731
    tc = lambda size: cost.comm_time(size)  # noqa: E731  (0 for size 0)
    tau_b, tau_s = [0.0] * n, [0.0] * n

    def comp_start(last: int, tau: float) -> None:  # CalculateCompStart on layers 0..last
        tau_b[last] = tau
        tau_s[last] = tau + tb[last]
        for l in range(last - 1, -1, -1):
            tau_b[l] = tau_s[l + 1] + ts(d[l + 1])
            tau_s[l] = tau_b[l] + tb[l]

    def comm_start() -> list[float]:  # CalculateCommStart
        tau_c = [0.0] * n
        tau_c[n - 1] = tau_s[n - 1] + ts(d[n - 1])
        for l in range(n - 2, -1, -1):
            tau_c[l] = max(tau_c[l + 1] + tc(d[l + 1]), tau_s[l] + ts(d[l]))
        return tau_c

    comp_start(n - 1, tf)
    tau_c = comm_start()
    for l in range(n - 1, 0, -1):
        u = tau_b[l] + tb[l] + tb[l - 1]
        q3 = u + ts(d[l]) + ts(d[l - 1]) < tau_c[l] + tc(d[l])
        q5 = tau_c[l] + cost.alpha > u + ts(d[l] + d[l - 1])
        if q3 and q5:
            tb[l - 1] += tb[l]
            tb[l] = 0.0
            d[l - 1] += d[l]
            d[l] = 0
            comp_start(l, tau_b[l] + tb[l])
            tau_c = comm_start()
            merged[l] = True
    return merged


def _optimal_plan(tb: Sequence[float], d: Sequence[int], cost: CostModel, tf: float) -> list[bool]:
    """Exact minimum of the model (NOTE [optimal planner]): a coarse pass (Pareto sets
    thinned to 64 pairs) finds a near-optimal plan whose time bounds the exact pass."""
    best = min(_heuristic_plans(tb, d, cost, tf), key=lambda plan: _model_time(tb, d, plan, cost, tf))
    coarse = _pareto_dp(tb, d, cost, tf, float("inf"), max_front=64)
    if _model_time(tb, d, coarse, cost, tf) < _model_time(tb, d, best, cost, tf):
        best = coarse
    exact = _pareto_dp(tb, d, cost, tf, _model_time(tb, d, best, cost, tf), max_front=_MAX_FRONT)
    return exact if exact is not None else best  # None: only if thinning lost every pair


def _pareto_dp(tb: Sequence[float], d: Sequence[int], cost: CostModel, tf: float, upper: float,
               max_front: int) -> list[bool] | None:
    """Exact minimum of the model over all ``2^(L-1)`` contiguous groupings.

    NOTE [optimal planner]
    Groups are chosen in backward order. After the layers ``i..L-1`` have been grouped the
    future only depends on two numbers: the compute clock ``c`` (end of the last
    sparsification) and the communication clock ``e >= c`` (end of the last all-gather),
    and the final time is non-decreasing in both. So for every boundary ``i`` we keep the
    Pareto set of ``(c, e)`` pairs (drop a pair if another has ``c' <= c`` and
    ``e' <= e``), extending every kept pair of every later boundary ``j`` by the group
    ``[i, j)``: ``c' = c + sum(tb[i:j]) + t_s(n)``, ``e' = max(c', e) + t_c(n)``. The
    answer is the smallest ``e`` at boundary 0. Pareto sets can grow large (tiny gamma,
    large alpha), so pairs are also dropped when a lower bound of their final time exceeds
    the best of a few simple plans (``e + t_c(rest merged)`` and ``c + sum(tb + t_s)`` of
    the rest layer by layer ``+ alpha``); both bounds are valid, so the result stays exact.
    Each boundary is one vectorised step over all kept pairs (torch, float64).
    Safeguard: if a Pareto set still exceeds ``_MAX_FRONT`` pairs (seen only with tiny
    gamma and large alpha, where thousands of plans differ by microseconds of
    sparsification), it is thinned to ``_MAX_FRONT`` cells of equal width in ``c``,
    keeping the smallest ``e`` per cell. A dropped pair is replaced by one with
    ``e' <= e`` and ``c' <= c + width``, and shifting ``c`` by ``width`` delays the end
    by at most ``width``, so each thinning costs at most one cell width (microseconds in
    those cases); without thinning (all profiles tested, ResNet-50) the plan is exact.
    """
    n = len(tb)
    f64 = torch.float64
    pre_t = torch.tensor([0.0] + list(accumulate(float(t) for t in tb)), dtype=f64)
    pre_d = torch.tensor([0] + list(accumulate(int(x) for x in d)), dtype=f64)
    size = (pre_d[None, :] - pre_d[:, None]).clamp(min=0)  # size[i, j] = elements of [i, j)
    log = torch.where(size > 1, size.clamp(min=1).log(), torch.zeros_like(size))
    t_s = cost.gamma * cost.rho * size * log + torch.where(size > 0, cost.ts0, 0.0)
    k = torch.where(size > 0, (cost.rho * size - 1e-9).ceil().clamp(min=1), torch.zeros_like(size))
    k = torch.minimum(k, size)
    t_c = torch.where(size > 0, cost.alpha + cost.beta * BYTES_PER_SELECTED * k, torch.zeros_like(size))
    work = (pre_t[None, :] - pre_t[:, None]) + t_s
    # lower bounds for the layers 0..i-1 still to group
    # per layer: backward + the superadditive part of t_s (ts0 is paid once per group, so
    # merging saves it: only the log term may be summed layer by layer in a lower bound)
    per_layer = torch.tensor([float(t) + cost.sparsify_time(int(x)) - cost.ts0 for t, x in zip(tb, d)], dtype=f64)
    rest_work = torch.cat([torch.zeros(1, dtype=f64), per_layer.cumsum(0)])  # rest_work[i]: layers < i
    rest_comm = t_c[0]  # rest_comm[i]: comm of layers < i merged into one group
    last_comm = cost.alpha + cost.beta * BYTES_PER_SELECTED
    upper *= 1 + 1e-9
    c_all = torch.tensor([float(tf)], dtype=f64)
    e_all = c_all.clone()
    b_all = torch.tensor([n])
    prev_all = torch.tensor([-1])
    live_all = torch.tensor([0])  # indices of pairs that may still be extended
    for i in range(n - 1, -1, -1):
        c_l, e_l, b_l = c_all[live_all], e_all[live_all], b_all[live_all]
        c2 = c_l + work[i, b_l]
        e2 = torch.maximum(c2, e_l) + t_c[i, b_l]
        if i > 0:
            bound = torch.maximum(c2 + rest_work[i] + cost.ts0 + last_comm, e2 + rest_comm[i])
        else:
            bound = e2
        keep = bound <= upper
        c2, e2, src = c2[keep], e2[keep], live_all[keep]
        order = torch.argsort(e2, stable=True)
        order = order[torch.argsort(c2[order], stable=True)]  # by c, then e
        c2, e2, src = c2[order], e2[order], src[order]
        if e2.numel():
            best_before = torch.cat([torch.tensor([float("inf")], dtype=f64), torch.cummin(e2, 0).values[:-1]])
            pareto = e2 < best_before
            c2, e2, src = c2[pareto], e2[pareto], src[pareto]
        if c2.numel() > max_front:  # thinning safeguard, see the NOTE
            cell = max(float(c2[-1] - c2[0]) / max_front, 0.0)
            bucket = ((c2 - c2[0]) / cell).floor() if cell > 0 else torch.zeros_like(c2)
            first = torch.ones_like(bucket, dtype=torch.bool)
            first[1:] = bucket[1:] != bucket[:-1]
            # sorted by c with e decreasing: the last pair of each cell has the smallest e
            last = torch.ones_like(first)
            last[:-1] = first[1:]
            c2, e2, src = c2[last], e2[last], src[last]
        c_all, e_all = torch.cat([c_all, c2]), torch.cat([e_all, e2])
        b_all = torch.cat([b_all, torch.full((c2.numel(),), i)])
        prev_all = torch.cat([prev_all, src])
        live_all = torch.cat([live_all, torch.arange(len(c_all) - c2.numel(), len(c_all))])
        if i > 0:  # retire pairs whose compute bound already exceeds: it only grows as i falls
            alive = c_all[live_all] + work[i - 1, b_all[live_all]] + rest_work[i - 1] + last_comm <= upper
            live_all = live_all[alive]
    at_zero = (b_all == 0).nonzero().flatten()
    if at_zero.numel() == 0:
        return None
    state = int(at_zero[torch.argmin(e_all[at_zero])])
    starts = []
    while int(prev_all[state]) >= 0:
        starts.append(int(b_all[state]))
        state = int(prev_all[state])
    return plan_from_groups([(s, 0) for s in starts], n)


_MAX_FRONT = 512


def _model_time(tb, d, plan, cost: CostModel, tf: float) -> float:
    return simulate(tb, d, plan, cost, tf)[-1]["comm_end"]


def _heuristic_plans(tb, d, cost: CostModel, tf: float) -> list[list[bool]]:
    """Cheap plans whose best modelled time bounds the optimum from above."""
    total = sum(int(x) for x in d)
    plans = [lags_plan(len(d)), single_bucket_plan(len(d)), _paper_plan(tb, d, cost, tf)]
    plans += [threshold_plan(d, max(1, total * 4 // parts)) for parts in (2, 4, 8, 16, 32, 64)]
    return plans


PLANNERS = {"paper": _paper_plan, "optimal": _optimal_plan}


def find_merged_layers(tb: Sequence[float], d: Sequence[int], alpha: float, beta: float,
                       gamma: float, rho: float, method: str = "paper", tf: float = 0.0,
                       ts0: float = 0.0) -> list[bool]:
    """Choose which layers to merge into the one before them (forward order).

    Args:
        tb: per-layer backward seconds in forward order (NOTE [OMGS conventions]).
        d: per-layer element counts in forward order.
        alpha, beta, gamma, rho: the fitted costs, see :class:`comm.omgs.CostModel`.
        method: ``"paper"`` (Algorithm 1, greedy, O(L^2)) or ``"optimal"`` (exact minimum
            of :func:`comm.omgs.predict_iteration_time`, NOTE [optimal planner]).
        tf: forward time (shifts every time stamp; default 0).
        ts0: fixed per-group sparsification overhead (default 0, as in the paper).

    Returns:
        ``merged``: ``merged[i]`` is True when layer i joins layer ``i - 1``;
        ``merged[0]`` is always False.

    Raises:
        ValueError: for an unknown method (lists the valid ones), an inconsistent profile
            or bad coefficients.

    Example:
        >>> find_merged_layers([0.0, 0.0], [1000, 1000], 1.0, 0.0, 0.0, 0.01)
        [False, True]
    """
    try:
        planner = PLANNERS[method]
    except KeyError:
        raise ValueError(f"unknown OMGS planner {method!r}; valid: {sorted(PLANNERS)}") from None
    validate_profile(tb, d)
    return planner(tb, d, CostModel(alpha, beta, gamma, rho, ts0), tf)


def lags_plan(num_layers: int) -> list[bool]:
    """LAGS-SGD: every layer is exchanged alone (no merging)."""
    if num_layers < 1:
        raise ValueError("need at least one layer")
    return [False] * num_layers


def single_bucket_plan(num_layers: int) -> list[bool]:
    """TopK-SGD: all layers in one group, exchanged after the whole backward."""
    if num_layers < 1:
        raise ValueError("need at least one layer")
    return [False] + [True] * (num_layers - 1)


def threshold_plan(d: Sequence[int], threshold_bytes: int, bytes_per_element: int = 4) -> list[bool]:
    """Fixed tensor fusion by size (Jizhi): in backward order, layers join the open group
    until its dense size reaches ``threshold_bytes``; then the group is closed.

    Raises:
        ValueError: if ``d`` is empty or the threshold is not positive.

    Example:
        >>> threshold_plan([10, 10, 10, 10], 80)
        [False, True, False, True]
    """
    if not d:
        raise ValueError("need at least one layer")
    if threshold_bytes <= 0:
        raise ValueError(f"threshold_bytes must be > 0, got {threshold_bytes}")
    merged, acc = [True] * len(d), 0
    for i in range(len(d) - 1, -1, -1):
        acc += int(d[i]) * bytes_per_element
        if acc >= threshold_bytes or i == 0:
            merged[i] = False
            acc = 0
    return merged
