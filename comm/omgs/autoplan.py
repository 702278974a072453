"""One call from a model to an OMGS plan (the trainer's ``--comm omgs``): profile backward,
fit the costs, plan the merged layers and share rank 0's plan. The plan then runs on the
engine (:func:`comm.omgs.build_omgs_exchanger`)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from comm import collective_ops as ops
from comm.omgs.model import CostModel
from comm.topk.checks import k_for
from comm.omgs.planner import find_merged_layers
from comm.omgs.profile import BackwardProfile, fit_alpha_beta, fit_gamma, measure_backward_times

__all__ = ["plan_omgs", "broadcast_plan"]


def broadcast_plan(plan: Sequence[bool], topology=None, src: int = 0) -> list[bool]:
    """Rank ``src``'s plan on every rank (plans computed from per-rank timings differ).

    Collective: every rank calls it with a plan of the same length.
    """
    flags = torch.tensor([bool(m) for m in plan], dtype=torch.uint8, device=_device(topology))
    ops.broadcast(flags, src=src)
    return [bool(f) for f in flags.tolist()]


def _device(topology) -> torch.device:
    return getattr(topology, "device", None) or torch.device("cpu")


def _mean(values: list[float], device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    ops.all_reduce(t)
    return (t / dist.get_world_size()).tolist()


def plan_omgs(model: torch.nn.Module, closure: Callable[[], torch.Tensor], topology=None, *,
              density: float, selector: str = "exact", method: str = "optimal",
              repeats: int = 3) -> tuple[list[bool], list[int], CostModel, BackwardProfile]:
    """Profile, fit and plan: everything ``--comm omgs`` needs. Collective.

    Steps: measure per-layer backward times with ``closure`` (rank 0's layer order, times
    averaged over ranks), fit alpha/beta on the default group and gamma with the chosen
    selector (on the topology's device), plan with ``method`` and share rank 0's plan.

    Args:
        model: the model (its parameters become the layers).
        closure: runs a forward pass on a representative batch and returns the loss.
        topology: a :class:`comm.Topology` (its ``device`` is where the fits run) or None (CPU).
        density: fraction of entries sent, in (0, 1].
        selector: top-k selector name (default ``"exact"``).
        method: ``"optimal"`` (default) or ``"paper"``.
        repeats: timed backward passes for the profile (default 3).

    Returns:
        ``(merged, order, cost_model, profile)``: the plan over the layers in ``order``
        (indices into the model's trainable parameters, forward order).

    Raises:
        ValueError: on a bad density, selector or method.

    Example:
        >>> merged, order, cost, prof = plan_omgs(model, lambda: loss_fn(model(x), y), topo,
        ...                                       density=0.001)  # doctest: +SKIP
        >>> params = [p for p in model.parameters() if p.requires_grad]  # doctest: +SKIP
        >>> ex = build_omgs_exchanger(params, topo, merged=merged, order=order, density=0.001)  # doctest: +SKIP
    """
    device = _device(topology)
    prof = measure_backward_times(model, closure, repeats=repeats)
    order = torch.tensor(prof.order, dtype=torch.int64, device=device)
    ops.broadcast(order, src=0)  # rank 0's layer order everywhere
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    mine = dict(zip(prof.order, prof.tb))
    order = order.tolist()
    tb = _mean([mine[i] for i in order], device)
    prof = BackwardProfile(names=[named[i][0] for i in order], tb=tb,
                           d=[named[i][1].numel() for i in order], order=order)
    total = sum(prof.d)
    alpha, beta = fit_alpha_beta(sorted({1, 64, 1024, k_for(total, density)} | {2}), topology)
    sizes = sorted(set(prof.d) | {total})
    gamma = _mean([fit_gamma(sizes, density, selector, repeats=2, device=device)], device)[0]
    cost = CostModel(alpha, beta, gamma, density)
    plan = broadcast_plan(find_merged_layers(tb, prof.d, alpha, beta, gamma, density, method=method), topology)
    return plan, order, cost, prof
