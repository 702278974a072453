"""``--comm auto``: choose a phase's exchange from the step model (:mod:`comm.step_model`
over the cost model's formulas, :mod:`comm.cost_model`); ``cachepipe plan`` chooses a
recipe's phases on paper with the same :func:`choose`.

NOTE [auto exchange]: a step costs its compute plus the exchange that backward does not
hide (NOTE [step model] in comm/step_model.py); for a model of one or a few buckets
(``resnet_small`` is one) nothing is hidden, so a job prices with the step model's
``MEASURED`` library, which adds them (an exchange that overlaps only makes the choice
more careful); ``cachepipe plan`` passes a testbed's library instead. Per
candidate the phase then costs ``steps * (compute + exchange)``, with the sparse
exchange priced at the phase's mean density over its remaining steps, so a run that is
mostly density warm-up (25 % falling to ``rho``) is priced as such. Inputs, all measured
on the job itself: ``compute`` (forward + backward per step, median of the first steps
of the phase, which run the sparse candidate), the top-k cost ``gamma`` (the same steps'
selection time per selected-over element), and the links' ``alpha``/``beta`` from timed
all-gathers (:func:`fit_links`: node leaders over the inter-node link, one stream, as
the model's NOTE [shared inter-node link] expects; a node's workers inside it). The
candidates are the registered algorithms that say ``auto=True`` (:mod:`comm.registry`):
``dense``, ``hier``, ``2dtar`` and one sparse one, ``hitopk`` (the sparse exchange that
kept the most accuracy per byte in docs/benchmarks/history/train.md; gtopk and topk_ag by name only). Sparse
is chosen only when it is predicted at least ``SPARSE_MARGIN`` faster than the best dense
one: error feedback delays 99 % of each step's entries, and a sparse run that is only
slightly faster per step can lose that by needing more steps to the same accuracy.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from comm import collective_ops as ops
from comm.collectives.base import all_gather_flat
from comm.cost_model import LinkParams
from comm.registry import ALGORITHMS
from comm.step_model import MEASURED, Library, step

__all__ = ["SPARSE_MARGIN", "Choice", "choose", "dense_candidates", "fit_links", "sparse_candidate"]

SPARSE_MARGIN = 0.10  # NOTE [auto exchange]
# the link fit's stream of messages (:func:`fit_links`): bytes per member, seconds, at most messages
STREAM_BYTES, STREAM_S, STREAM_MAX = 32 << 10, 0.4, 64


def dense_candidates() -> tuple[str, ...]:
    """The dense algorithms ``auto`` prices, in registration order (ties go to the first)."""
    return tuple(n for n, a in ALGORITHMS.items() if a.auto and not a.sparse)


def sparse_candidate() -> str:
    """The sparse algorithm ``auto`` prices, and runs during a phase's first steps: the
    first registered sparse one with ``auto=True``.

    Raises:
        ValueError: if no sparse algorithm is an ``auto`` candidate.
    """
    found = [n for n, a in ALGORITHMS.items() if a.auto and a.sparse]
    if not found:
        raise ValueError("--comm auto needs a sparse algorithm registered with auto=True; none is")
    return found[0]


@dataclass(frozen=True)
class Choice:
    """The exchange ``auto`` picked, why (one line), and each candidate's predicted seconds per step."""

    name: str
    reason: str
    step_s: dict[str, float]


def choose(*, numel: int, nodes: int, local_size: int, link: LinkParams, compute_s: float, steps: int,
           mean_density: float, update_s: float = 0.0, library: Library = MEASURED, buckets: int = 1,
           value_bytes: int = 4, basis: str = "measured") -> Choice:
    """Pick the fastest candidate for ``steps`` steps (NOTE [auto exchange]), each priced by
    the step model (:func:`comm.step_model.step`; ``cachepipe plan`` calls this too).

    Args:
        numel, nodes, local_size, link, compute_s: as :func:`comm.step_model.step`.
        steps: steps left in the phase (said in the reason).
        mean_density: the sparse candidate's mean density over those steps.
        update_s, library, buckets, value_bytes: as :func:`comm.step_model.step`; a
            training job's defaults price compute plus exchange, nothing hidden.
        basis: how the compute and links were obtained, said in the reason.

    Example:
        >>> link = LinkParams.from_bandwidth(inter_mbit=4)
        >>> choose(numel=78_042, nodes=2, local_size=2, link=link, compute_s=0.16, steps=2000,
        ...        mean_density=0.02).name
        'hitopk'
        >>> choose(numel=78_042, nodes=2, local_size=2, link=LinkParams.from_bandwidth(inter_mbit=100_000),
        ...        compute_s=0.16, steps=2000, mean_density=0.02).name in dense_candidates()
        True
    """
    candidate = sparse_candidate()
    names = dense_candidates() + (candidate,)
    step_s = {n: step(n, numel=numel, density=mean_density if n == candidate else None, nodes=nodes,
                      local_size=local_size, link=link, compute_s=compute_s, update_s=update_s, library=library,
                      buckets=buckets, value_bytes=value_bytes).total_s for n in names}
    dense = min(dense_candidates(), key=step_s.get)
    sparse = step_s[candidate]
    pays = sparse <= (1 - SPARSE_MARGIN) * step_s[dense]
    name = candidate if pays else dense
    others = ", ".join(f"{n} {step_s[n]:.3f}" for n in names if n != name)
    verdict = "" if pays else f"sparse would not pay (needs {SPARSE_MARGIN:.0%} less time than {dense}): "
    reason = (f"{verdict}{step_s[name]:.3f} s/step predicted against {others}; compute {compute_s * 1e3:.0f} ms/step "
              f"{basis}, inter-node link {link.alpha_inter * 1e3:.2f} ms + {_rate(link.beta_inter)}, "
              f"{numel:,} parameters, {steps:,} steps at mean density {mean_density:.2%}")
    return Choice(name, reason, step_s)


def _rate(beta: float) -> str:
    return "unlimited" if beta <= 0 else f"{8 / beta / 1e6:,.1f} Mbit/s"


def _latency(group, size: int, shm, active: bool, repeats: int) -> float:
    """Median over ``repeats`` (after one untimed) of the slowest rank's all-gather of one
    float; ranks not ``active`` take part only in the timing's max."""
    x, times = torch.zeros(1), []  # zeros: the run's random stream is left untouched
    for r in range(repeats + 1):
        ops.barrier()
        start = time.perf_counter()
        if active:
            all_gather_flat(x, group, size, shm)
        t = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        ops.all_reduce(t, op=dist.ReduceOp.MAX)
        if r:
            times.append(float(t))
    return statistics.median(times)


def _seconds_per_byte(group, size: int, shm, active: bool, alpha: float) -> float:
    """Steady-state seconds per byte a member receives, from back-to-back all-gathers of
    ``STREAM_BYTES``: the median of the last four, after ``STREAM_S`` or ``STREAM_MAX``
    messages. Back to back, an emulated link's burst credit (NOTE [tbf burst] in
    tools/bench/harness/cluster.py) is spent within the first messages, so the rate is the link's. The
    first member's payload carries the stop flag, so all members run the same count."""
    beta = torch.zeros(1, dtype=torch.float64)
    if active:
        x, times, start = torch.zeros(STREAM_BYTES // 4), [], time.perf_counter()
        while True:
            x[0] = float(time.perf_counter() - start > STREAM_S or len(times) + 1 >= STREAM_MAX)
            t0 = time.perf_counter()
            out = all_gather_flat(x, group, size, shm)
            times.append(time.perf_counter() - t0)
            if out[0] > 0:
                break
        beta[0] = max(statistics.median(times[-4:]) - alpha, 0.0) / ((size - 1) * STREAM_BYTES)
    ops.all_reduce(beta, op=dist.ReduceOp.MAX)
    return float(beta[0])


def fit_links(topology, *, gamma: float = 0.0, repeats: int = 3) -> LinkParams:
    """Fit ``alpha``/``beta`` of the intra- and inter-node links on this job (collective;
    NOTE [auto exchange]). Inter-node: the node leaders alone (one stream over a node's
    link); intra-node: every node's workers at once, through the transport the exchanges use.
    """
    fits = {}
    for level, group, size, shm, active in (
            ("inter", topology.leader_group, topology.nodes, None, topology.local_rank == 0),
            ("intra", topology.intra_group, topology.local_size, topology.shm, True)):
        if size < 2:
            fits[level] = (0.0, 0.0)
            continue
        alpha = _latency(group, size, shm, active, repeats)
        fits[level] = (alpha, _seconds_per_byte(group, size, shm, active, alpha))
    return LinkParams(alpha_intra=fits["intra"][0], beta_intra=fits["intra"][1], alpha_inter=fits["inter"][0],
                      beta_inter=fits["inter"][1], gamma=gamma)
