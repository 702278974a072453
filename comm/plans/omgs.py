"""``omgs`` plan: the merged layers of the OMGS planner (:func:`comm.omgs.find_merged_layers`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from comm.plans.base import Bucket

__all__ = ["OMGSPlan"]


@dataclass(frozen=True)
class OMGSPlan:
    """One bucket per merged group, last group first; inside a group the parameters are
    packed in forward order (NOTE [OMGS conventions] in comm/omgs/model.py).

    Args:
        merged: ``merged[i]`` joins layer i to layer i - 1 (layers in forward order: the
            order of the parameters the plan is given); ``None`` = every layer alone.
    """

    name: ClassVar[str] = "omgs"
    merged: tuple[bool, ...] | None = None

    def __post_init__(self):
        if self.merged is not None:
            object.__setattr__(self, "merged", tuple(bool(m) for m in self.merged))

    def buckets(self, params: list[torch.Tensor], algorithm: str):
        """Raises:
            ValueError: if ``merged`` does not have one entry per parameter."""
        from comm.omgs.model import groups_from_plan

        merged = [False] * len(params) if self.merged is None else list(self.merged)
        if len(merged) != len(params):
            raise ValueError(f"OMGS plan has {len(merged)} entries for {len(params)} parameters")
        return [Bucket(tuple(range(s, e)), algorithm) for s, e in reversed(groups_from_plan(merged))]
