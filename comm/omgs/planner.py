"""Merged-layer planners: the paper's greedy FindMergedLayers and an exact optimum.

Conventions (forward-order lists, ``merged[i]`` joins layer i to layer ``i - 1``) are in
NOTE [OMGS conventions] in ``comm/omgs/model.py``.
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

from comm.omgs.model import CostModel, plan_from_groups, validate_profile

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
    """Exact minimum of the model over all ``2^(L-1)`` contiguous groupings.

    NOTE [optimal planner]
    Groups are chosen in backward order. After the layers ``j..L-1`` have been grouped the
    future only depends on two numbers: the compute clock ``c`` (end of the last
    sparsification) and the communication clock ``e`` (end of the last all-gather), and
    the final time is non-decreasing in both. So for every boundary ``j`` we keep the
    Pareto set of ``(c, e)`` pairs (no pair is kept if another has ``c' <= c`` and
    ``e' <= e``) and extend each pair by every next group ``[i, j)``:
    ``c' = c + sum(tb[i:j]) + t_s(n)``, ``e' = max(c', e) + t_c(n)``. The answer is the
    pair with the smallest ``e`` at boundary 0. Cost: ``O(L^2 * F)`` for Pareto sets of
    size F (small in practice: well under a second for 200+ layers).
    """
    n = len(tb)
    pre_t = [0.0] + list(accumulate(float(t) for t in tb))
    pre_d = [0] + list(accumulate(int(x) for x in d))
    # fronts[j]: list of (c, e, prev_boundary, prev_index), Pareto-minimal, sorted by c
    fronts: list[list[tuple[float, float, int, int]]] = [[] for _ in range(n + 1)]
    fronts[n] = [(float(tf), float(tf), -1, -1)]
    for i in range(n - 1, -1, -1):
        candidates = []
        for j in range(i + 1, n + 1):
            size = pre_d[j] - pre_d[i]
            work = pre_t[j] - pre_t[i] + cost.sparsify_time(size)
            comm = cost.comm_time(size)
            for idx, (c, e, _, _) in enumerate(fronts[j]):
                c2 = c + work
                candidates.append((c2, max(c2, e) + comm, j, idx))
        candidates.sort()
        front, best_e = [], float("inf")
        for cand in candidates:
            if cand[1] < best_e:
                front.append(cand)
                best_e = cand[1]
        fronts[i] = front
    # walk back from the best final pair
    idx = min(range(len(fronts[0])), key=lambda k: fronts[0][k][1])
    bounds, i = [], 0
    while i < n:
        _, _, j, prev = fronts[i][idx]
        bounds.append((i, j))
        i, idx = j, prev
    return plan_from_groups(bounds, n)


PLANNERS = {"paper": _paper_plan, "optimal": _optimal_plan}


def find_merged_layers(tb: Sequence[float], d: Sequence[int], alpha: float, beta: float,
                       gamma: float, rho: float, method: str = "paper", tf: float = 0.0) -> list[bool]:
    """Choose which layers to merge into the one before them (forward order).

    Args:
        tb: per-layer backward seconds in forward order (NOTE [OMGS conventions]).
        d: per-layer element counts in forward order.
        alpha, beta, gamma, rho: the fitted costs, see :class:`comm.omgs.CostModel`.
        method: ``"paper"`` (Algorithm 1, greedy, O(L^2)) or ``"optimal"`` (exact minimum
            of :func:`comm.omgs.predict_iteration_time`, NOTE [optimal planner]).
        tf: forward time (shifts every time stamp; default 0).

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
    return planner(tb, d, CostModel(alpha, beta, gamma, rho), tf)


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
