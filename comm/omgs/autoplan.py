"""One call from a model to a planned, pipelined OMGS exchanger (the trainer's ``--comm omgs``)."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from comm.omgs.model import CostModel, selected_count
from comm.omgs.pipeline import OMGSExchanger, broadcast_plan, resolve_group
from comm.omgs.planner import find_merged_layers
from comm.omgs.profile import BackwardProfile, fit_alpha_beta, fit_gamma, measure_backward_times

__all__ = ["build_omgs_exchanger"]


def _mean(values: list[float], group) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, group=group)
    return (t / dist.get_world_size(group)).tolist()


def build_omgs_exchanger(model: torch.nn.Module, closure: Callable[[], torch.Tensor], topology=None, *,
                         density: float, selector: str = "exact", method: str = "optimal",
                         repeats: int = 3) -> tuple[OMGSExchanger, CostModel, BackwardProfile]:
    """Profile, fit, plan and build: everything ``--comm omgs`` needs. Collective.

    Steps: measure per-layer backward times with ``closure`` (rank 0's layer order, times
    averaged over ranks), fit alpha/beta on the process group and gamma with the chosen
    selector, plan with ``method``, share rank 0's plan, and build the exchanger.

    Args:
        model: the model (its parameters become the layers).
        closure: runs a forward pass on a representative batch and returns the loss.
        topology: ``None`` (default group), a ProcessGroup or an object with ``world_group``.
        density: fraction of entries sent, in (0, 1].
        selector: top-k selector name (default ``"exact"``).
        method: ``"optimal"`` (default) or ``"paper"``.
        repeats: timed backward passes for the profile (default 3).

    Returns:
        ``(exchanger, cost_model, profile)``.

    Raises:
        ValueError: on a bad density, selector or method.

    Example:
        >>> ex, cost, prof = build_omgs_exchanger(model, lambda: loss_fn(model(x), y),
        ...                                       density=0.001)  # doctest: +SKIP
    """
    group = resolve_group(topology)
    prof = measure_backward_times(model, closure, repeats=repeats)
    order = torch.tensor(prof.order, dtype=torch.int64)
    dist.broadcast(order, src=0, group=group)  # rank 0's layer order everywhere
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    mine = dict(zip(prof.order, prof.tb))
    order = order.tolist()
    tb = _mean([mine[i] for i in order], group)
    prof = BackwardProfile(names=[named[i][0] for i in order], tb=tb,
                           d=[named[i][1].numel() for i in order], order=order)
    total = sum(prof.d)
    alpha, beta = fit_alpha_beta(sorted({1, 64, 1024, selected_count(total, density)} | {2}), topology)
    sizes = sorted(set(prof.d) | {total})
    gamma = _mean([fit_gamma(sizes, density, selector, repeats=2)], group)[0]
    cost = CostModel(alpha, beta, gamma, density)
    plan = find_merged_layers(tb, prof.d, alpha, beta, gamma, density, method=method)
    plan = broadcast_plan(plan, topology)
    exchanger = OMGSExchanger([named[i][1] for i in order], topology, density=density,
                              selector=selector, plan=plan)
    return exchanger, cost, prof
