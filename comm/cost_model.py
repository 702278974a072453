"""Alpha-beta cost model of every exchange algorithm, and a fit of its parameters.

Each algorithm's time is linear in five parameters (:class:`LinkParams`): the latency
``alpha`` and per-byte time ``beta`` of the intra- and inter-node links, and ``gamma``,
the top-k selection time per input element. Each algorithm declares its formula (the
papers') in its own module (``Algorithm.cost``, NOTE [one registry of names] in
comm/algorithm.py), with :func:`add_link` and :func:`log2`; ``coefficients`` returns the
multipliers of each parameter it gives, ``predict`` their dot product with
given parameters, and ``fit`` least-squares parameters from measured exchanges, so a
user can predict where sparse beats dense on their cluster.

NOTE [shared inter-node link]: the papers give each inter-node stream the full link; on
clouds (and in ``cachepipe bench comm``) the ``n`` workers of a node share one NIC, so
by default the bytes of concurrent per-local-rank streams add up on the node's link.

NOTE [all-gather latency]: ``topk_ag``'s all-gather of ``k`` pairs per worker takes
``P - 1`` latency steps as a ring (gloo and NCCL rings) but ``log2 P`` as recursive
doubling (the gTop-k paper's model, and MPI's choice for small messages); the bytes are
the same. ``allgather="ring"`` or ``"rd"`` picks the form, and :func:`fit_allgather`
fits both on measured exchanges and keeps the one that predicts them better.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

import numpy as np

from comm.registry import ALGORITHMS, DENSE, get_algorithm, names

__all__ = ["add_link", "log2", "LinkParams", "PARAMS", "ALLGATHER_FORMS", "coefficients", "predict", "fit",
           "fit_allgather"]

PARAMS = ("alpha_intra", "beta_intra", "alpha_inter", "beta_inter", "gamma")
ALLGATHER_FORMS = ("ring", "rd")  # NOTE [all-gather latency]


@dataclass(frozen=True)
class LinkParams:
    """Cost model parameters (seconds, seconds per byte, seconds per element).

    Raises:
        ValueError: if any parameter is negative.
    """

    alpha_intra: float = 2e-5
    beta_intra: float = 1 / 10e9
    alpha_inter: float = 1e-4
    beta_inter: float = 8 / 1e9
    gamma: float = 0.0

    def __post_init__(self):
        for k, v in asdict(self).items():
            if v < 0 or not math.isfinite(v):
                raise ValueError(f"{k} must be a finite number >= 0, got {v}")

    @classmethod
    def from_bandwidth(cls, inter_mbit: float, intra_gbit: float = 80.0, **kw) -> "LinkParams":
        """Parameters from nominal link rates (Mbit/s between nodes, Gbit/s inside)."""
        return cls(beta_inter=8 / (inter_mbit * 1e6), beta_intra=8 / (intra_gbit * 1e9), **kw)


def log2(x: int) -> int:
    """``ceil(log2(x))`` rounds of a tree over ``x`` members (0 for one)."""
    return math.ceil(math.log2(x)) if x > 1 else 0


def coefficients(algorithm: str, numel: int, density: float | None, nodes: int, local_size: int, *,
                 value_bytes: int = 4, index_bytes: int = 4, shared_inter_link: bool = True,
                 allgather: str = "ring") -> dict[str, float]:
    """Multipliers of each of ``PARAMS`` in the time of one exchange.

    ``allgather``: latency form of ``topk_ag``'s all-gather, ``"ring"`` (``P - 1`` steps)
    or ``"rd"`` (recursive doubling, ``log2 P``); NOTE [all-gather latency].

    Raises:
        ValueError: unknown algorithm or all-gather form, or a sparse algorithm without a
            density in (0, 1].
    """
    if allgather not in ALLGATHER_FORMS:
        raise ValueError(f"unknown all-gather form {allgather!r}; valid: {list(ALLGATHER_FORMS)}")

    spec = get_algorithm(algorithm)
    if spec.cost is None:
        raise ValueError(f"no cost model for {algorithm!r}; valid: {[n for n, a in ALGORITHMS.items() if a.cost]}")
    if spec.sparse and (density is None or not 0 < density <= 1):
        raise ValueError(f"{algorithm} needs a density in (0, 1], got {density!r}")
    c = dict.fromkeys(PARAMS, 0.0)
    m, n, d = nodes, local_size, numel
    share = n if shared_inter_link else 1
    spec.cost(c, m=m, n=n, d=d, b=value_bytes, bi=index_bytes, rho=density, share=share,
                         allgather=allgather)
    return c


def add_link(c: dict, level: str, steps: int, nbytes: float) -> None:
    """Add ``steps`` messages and ``nbytes`` bytes on the ``intra`` or ``inter`` link to ``c``
    (what a cost formula does per phase of its collective)."""
    c[f"alpha_{level}"] += steps
    c[f"beta_{level}"] += nbytes




def predict(algorithm: str, numel: int, density: float | None, nodes: int, local_size: int,
            params: LinkParams, **kw) -> float:
    """Predicted seconds of one exchange of ``numel`` elements.

    Example:
        >>> p = LinkParams.from_bandwidth(inter_mbit=200)
        >>> sparse = names(sparse=True, per_bucket=True)[-1]  # the last sparse one registered
        >>> predict(sparse, 25_557_032, 0.01, 2, 2, p) < predict(DENSE, 25_557_032, None, 2, 2, p)
        True
    """
    c = coefficients(algorithm, numel, density, nodes, local_size, **kw)
    return float(sum(c[k] * getattr(params, k) for k in PARAMS))


def fit(rows: Iterable[Mapping], **kw) -> LinkParams:
    """Non-negative least-squares parameters from measured exchanges.

    Args:
        rows: dicts with ``algorithm, numel, density, nodes, local_size, median_s``.
        **kw: passed to :func:`coefficients` (``value_bytes``, ``index_bytes``, ...).

    Raises:
        ValueError: if ``rows`` is empty.
    """
    rows = list(rows)
    if not rows:
        raise ValueError("fit needs at least one measured exchange")
    a = np.array([[coefficients(r["algorithm"], r["numel"], r.get("density"), r["nodes"], r["local_size"],
                                **kw)[k] for k in PARAMS] for r in rows])
    y = np.array([float(r["median_s"]) for r in rows])
    # relative error matters: weight each row by 1/time so small exchanges count too
    w = 1.0 / np.maximum(y, 1e-6)
    active = [j for j in range(len(PARAMS)) if a[:, j].any()]
    x = np.zeros(len(PARAMS))
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active] * w[:, None], y * w, rcond=None)
        if (sol >= 0).all():
            x[active] = sol
            break
        active = [j for j, s in zip(active, sol) if s > 0]
    return LinkParams(**dict(zip(PARAMS, x.tolist())))


def fit_allgather(rows: Iterable[Mapping], **kw) -> tuple[str, LinkParams, dict[str, float]]:
    """Fit :func:`fit` with each all-gather latency form and keep the better predictor
    (NOTE [all-gather latency]).

    Returns:
        ``(form, params, errors)``: the chosen form, its fitted parameters, and each form's
        median relative prediction error over ``rows`` (ties keep ``"ring"``).

    Raises:
        ValueError: if ``rows`` is empty.
    """
    rows = list(rows)
    fits, errors = {}, {}
    for form in ALLGATHER_FORMS:
        fits[form] = fit(rows, allgather=form, **kw)
        errors[form] = float(np.median([abs(predict(r["algorithm"], r["numel"], r.get("density"), r["nodes"],
                                                     r["local_size"], fits[form], allgather=form, **kw)
                                             - float(r["median_s"])) / max(float(r["median_s"]), 1e-9)
                                         for r in rows]))
    best = min(ALLGATHER_FORMS, key=lambda f: (errors[f], f != "ring"))
    return best, fits[best], errors
