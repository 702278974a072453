"""``omgs``: OMGS-SGD as an exchange algorithm: ``topk_ag`` on the merged layers of the
OMGS planner, run by the engine, which starts each merged group's exchange as soon as
backward has produced it (NOTE [OMGS conventions] in comm/omgs/model.py).

:func:`build_omgs_exchanger` is the one place the engine is assembled on a merged-layer
plan: the trainer's ``--comm omgs`` (through ``ALGORITHM.build``), ``cachepipe bench
overlap`` and ``cachepipe bench omgs`` all call it.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from comm.algorithm import Algorithm
from comm.collectives.topk_ag import TopKAllGatherExchanger
from comm.engine import GradientExchanger
from comm.plans.omgs import OMGSPlan

__all__ = ["ALGORITHM", "OMGSOptions", "build", "build_omgs_exchanger"]

PLANS = ("auto", "lags")


@dataclass(frozen=True)
class OMGSOptions:
    """``plan``: ``auto`` profiles backward and plans the merged layers when the exchange is
    built (:func:`comm.omgs.plan_omgs`); ``lags`` keeps every layer alone (deterministic,
    no profiling)."""

    plan: str = "auto"

    def __post_init__(self):
        if self.plan not in PLANS:
            raise ValueError(f"omgs plan must be one of {list(PLANS)}; got {self.plan!r}")


def build_omgs_exchanger(params: Sequence[torch.Tensor], topology, *, merged: Sequence[bool] | None = None,
                         order: Sequence[int] | None = None, **engine):
    """The engine exchanging ``params`` with ``topk_ag`` on the merged groups of ``merged``.

    Args:
        params: the trainable parameters, forward order.
        topology: a :class:`comm.Topology`.
        merged: the plan over the layers in ``order`` (:func:`comm.omgs.find_merged_layers`);
            None: every layer alone (LAGS).
        order: indices into ``params`` in the order the plan indexes them (the order
            :func:`comm.omgs.plan_omgs` returns); default ``params``' own.
        **engine: the other :class:`comm.GradientExchanger` arguments (density, selector, ...).

    Raises:
        ValueError: as :class:`comm.GradientExchanger`, or a plan of the wrong length.
    """
    layers = list(params) if order is None else [params[i] for i in order]
    return GradientExchanger(layers, TopKAllGatherExchanger.name, topology, plan=OMGSPlan(merged), **engine)


def build(model: torch.nn.Module, topology, options: OMGSOptions, *, probe=None, layout: dict | None = None,
          density: float, selector: str, **engine):
    """``Algorithm.build`` of ``omgs``: the phase's exchanger and the layout that rebuilds it.

    ``layout`` (a saved one: the same groups on resume) wins; else with ``options.plan ==
    "auto"`` and a ``probe() -> loss`` the plan comes from profiling backward
    (:func:`comm.omgs.plan_omgs`: rank 0's plan everywhere, collective); else every layer
    is alone (LAGS).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if layout:
        order, plan = list(layout["order"]), list(layout["plan"])
    elif probe is not None and options.plan == "auto":
        from comm.omgs.autoplan import plan_omgs

        plan, order, _, _ = plan_omgs(model, probe, topology, density=density, selector=selector)
    else:
        order, plan = list(range(len(params))), [False] * len(params)
    exchanger = build_omgs_exchanger(params, topology, merged=plan, order=order, density=density, selector=selector,
                                     **engine)
    return exchanger, {"order": order, "plan": plan}


ALGORITHM = Algorithm("omgs", sparse=True, options=OMGSOptions, build=build)
