"""Bucket plans: which parameters travel together, with which algorithm, in which order.

A plan is a small frozen object, validated when made, whose ``buckets(params, algorithm)``
takes the parameters (in the order the caller registers them, forward order for a model)
and the main algorithm and returns a list of :class:`Bucket` in launch order (backward
order: the bucket whose gradients are ready first comes first). Plan classes are
registered by name in ``PLANNERS``; adding a planner is one file plus one line here.

- ``size`` (:class:`SizePlan`): Jizhi's tensor fusion: buckets up to a byte threshold,
  small buckets take ``hier`` (the hybrid choice);
- ``layer`` (:class:`LayerPlan`): one bucket per parameter (LAGS);
- ``omgs`` (:class:`OMGSPlan`): merged neighbouring layers from the OMGS planner
  (``merged`` list of :func:`comm.omgs.find_merged_layers`).
"""
from __future__ import annotations

from comm.plans.base import Bucket, Plan
from comm.plans.layer import LayerPlan
from comm.plans.omgs import OMGSPlan
from comm.plans.size import SizePlan

__all__ = ["Bucket", "LayerPlan", "OMGSPlan", "PLANNERS", "Plan", "SizePlan", "make_plan"]

PLANNERS: dict[str, type] = {cls.name: cls for cls in (SizePlan, LayerPlan, OMGSPlan)}


def make_plan(kind: str, **options) -> Plan:
    """The plan of planner ``kind`` with ``options`` (see the module docstring).

    Raises:
        ValueError: for an unknown planner (lists the valid ones) or bad options.
    """
    try:
        cls = PLANNERS[kind]
    except KeyError:
        raise ValueError(f"unknown bucket plan {kind!r}; valid: {sorted(PLANNERS)}") from None
    return cls(**options)
