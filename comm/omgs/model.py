"""The MGS-SGD iteration-time model of the OMGS paper (INFOCOM 2020, eqs. 5-11 and 17).

NOTE [OMGS conventions]
Every per-layer list in ``comm.omgs`` is indexed in FORWARD order: index 0 is the first
layer (tensor) of the model, index ``L - 1`` the last. Backward runs from ``L - 1`` down
to 0, so layer ``L - 1`` gets its gradient first.

- ``tb[i]``: seconds of backward compute that produce layer i's gradient (the paper's
  ``t_b^(l)``), measured from the previous gradient becoming ready to this one.
- ``d[i]``: number of gradient elements of layer i (the paper's ``d^(l)``).
- ``merged[i]``: True when layer i is merged into layer ``i - 1`` (the layer BEFORE it in
  forward order, i.e. the one whose gradient is computed right AFTER it in backward).
  ``merged[0]`` is always False. A group is therefore a contiguous run
  ``[s, e]`` with ``merged[s] == False`` and ``merged[s+1..e] == True``; it becomes ready
  when layer ``s`` (its lowest index) finishes backward.
- A group of ``n`` elements selects ``k(n) = ceil(rho * n)`` entries (at least 1;
  ``comm.topk.k_for``, the count every sparse exchange uses).
  Sparsification costs ``t_s(n) = ts0 + gamma * rho * n * ln n`` (eq. 10, natural log,
  the log term 0 for n <= 1); ``ts0`` (default 0, as in the paper) is an optional fixed
  per-group CPU overhead (hooks, kernel launches, Python), which dominates tiny layers.
- The sparse all-gather sends, per worker, ``k`` float32 values and ``k`` int32 indices
  packed into ONE tensor: ``BYTES_PER_SELECTED = 8`` bytes per selected element, and
  costs ``t_c(n) = alpha + beta * 8 * k(n)`` (eq. 11, beta in seconds per byte of one
  worker's payload; the fan-in of the all-gather is folded into the fitted beta).
- Timeline (eqs. 6-9, 17): the backward of the next layer starts only after the current
  group's sparsification (it runs on the same stream/thread); a group's communication
  starts when it is sparsified AND the previous group's communication has finished. The
  iteration time is ``t_f`` plus the end of the last communication (backward starts at
  ``t_f``; the update is ignored, as in the paper).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from comm.topk.checks import k_for

__all__ = [
    "BYTES_PER_SELECTED",
    "CostModel",
    "groups_from_plan",
    "plan_from_groups",
    "simulate",
    "predict_iteration_time",
    "validate_profile",
]

BYTES_PER_SELECTED = 8  # float32 value + int32 index, see NOTE [OMGS conventions]


@dataclass(frozen=True)
class CostModel:
    """Fitted costs of one device and process group (see NOTE [OMGS conventions]).

    Args:
        alpha: all-gather start-up time in seconds (>= 0).
        beta: all-gather seconds per byte of one worker's payload (>= 0).
        gamma: top-k cost coefficient in ``gamma * rho * n * ln n`` (>= 0).
        rho: density, the fraction of entries kept, in (0, 1].
        ts0: fixed per-group sparsification overhead in seconds (>= 0, default 0).

    Raises:
        ValueError: on a negative coefficient or a density outside (0, 1].
    """

    alpha: float
    beta: float
    gamma: float
    rho: float
    ts0: float = 0.0

    def __post_init__(self):
        for name in ("alpha", "beta", "gamma", "ts0"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 < self.rho <= 1:
            raise ValueError(f"rho (density) must be in (0, 1], got {self.rho}")

    def sparsify_time(self, n: int) -> float:
        """``t_s(n) = ts0 + gamma * rho * n * ln n`` (eq. 10); 0 for an empty group."""
        if n <= 0:
            return 0.0
        return self.ts0 + (self.gamma * self.rho * n * math.log(n) if n > 1 else 0.0)

    def comm_time(self, n: int) -> float:
        """``t_c(n) = alpha + beta * 8 * k(n)`` (eq. 11); 0 for an empty group."""
        if n <= 0:
            return 0.0
        return self.alpha + self.beta * BYTES_PER_SELECTED * k_for(n, self.rho)


def validate_profile(tb: Sequence[float], d: Sequence[int]) -> None:
    """Check that ``tb`` and ``d`` describe the same non-empty list of layers.

    Raises:
        ValueError: on different lengths, no layers, a negative time or a size < 1.
    """
    if len(tb) != len(d):
        raise ValueError(f"tb and d must have the same length, got {len(tb)} and {len(d)}")
    if not tb:
        raise ValueError("need at least one layer")
    if any(not t >= 0 for t in tb):
        raise ValueError("backward times tb must be >= 0")
    if any(int(n) < 1 for n in d):
        raise ValueError("layer sizes d must be >= 1")


def groups_from_plan(merged: Sequence[bool]) -> list[tuple[int, int]]:
    """Turn a plan into groups ``(start, end_exclusive)`` in forward order.

    Raises:
        ValueError: if the plan is empty or ``merged[0]`` is True.

    Example:
        >>> groups_from_plan([False, True, False])
        [(0, 2), (2, 3)]
    """
    if not merged:
        raise ValueError("a plan needs at least one layer")
    if merged[0]:
        raise ValueError("the first layer cannot be merged (merged[0] must be False)")
    starts = [i for i, m in enumerate(merged) if not m] + [len(merged)]
    return [(starts[j], starts[j + 1]) for j in range(len(starts) - 1)]


def plan_from_groups(bounds: Sequence[tuple[int, int]], num_layers: int) -> list[bool]:
    """Inverse of :func:`groups_from_plan`."""
    merged = [True] * num_layers
    for start, _ in bounds:
        merged[start] = False
    return merged


def simulate(tb: Sequence[float], d: Sequence[int], merged: Sequence[bool], cost: CostModel,
             tf: float = 0.0) -> list[dict]:
    """Timeline of every group, in BACKWARD order (the order groups are exchanged).

    Returns:
        One dict per group with ``start``, ``end`` (forward indices, end exclusive),
        ``numel``, ``ready`` (backward done), ``sparsified``, ``comm_start``, ``comm_end``.

    Raises:
        ValueError: on an inconsistent profile or plan.
    """
    validate_profile(tb, d)
    if len(merged) != len(tb):
        raise ValueError(f"plan has {len(merged)} entries for {len(tb)} layers")
    clock, comm_end, rows = float(tf), float(tf), []
    for start, end in reversed(groups_from_plan(merged)):
        numel = int(sum(d[start:end]))
        ready = clock + float(sum(tb[start:end]))
        clock = ready + cost.sparsify_time(numel)            # eq. 6: blocks the next backward
        comm_start = max(clock, comm_end)                     # eq. 8
        comm_end = comm_start + cost.comm_time(numel)
        rows.append(dict(start=start, end=end, numel=numel, ready=ready, sparsified=clock,
                         comm_start=comm_start, comm_end=comm_end))
    return rows


def predict_iteration_time(tb: Sequence[float], d: Sequence[int], merged: Sequence[bool],
                           alpha: float, beta: float, gamma: float, rho: float,
                           tf: float = 0.0, tu: float = 0.0, ts0: float = 0.0) -> float:
    """Modelled iteration time of MGS-SGD with the given plan (eq. 17).

    Args:
        tb: per-layer backward seconds, forward order (NOTE [OMGS conventions]).
        d: per-layer element counts, forward order.
        merged: the plan; ``merged[i]`` merges layer i into layer ``i - 1``.
        alpha, beta, gamma, rho: see :class:`CostModel`.
        tf: forward time added in front (default 0: the time from backward start).
        tu: time after the last all-gather (decompression and update; default 0, which
            the paper assumes).
        ts0: fixed per-group sparsification overhead (default 0, as in the paper).

    Returns:
        Seconds from the start of the iteration to the end of the last communication.

    Raises:
        ValueError: on an inconsistent profile or plan, or bad coefficients.

    Example:
        >>> predict_iteration_time([1.0, 1.0], [100, 100], [False, False], 0.5, 0.0, 0.0, 0.1)
        2.5
    """
    rows = simulate(tb, d, merged, CostModel(alpha, beta, gamma, rho, ts0), tf)
    return rows[-1]["comm_end"] + tu
