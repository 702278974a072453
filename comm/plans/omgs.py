"""``omgs`` plan: the merged layers of the OMGS planner (:func:`comm.omgs.find_merged_layers`)."""
from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["plan"]


def plan(params: list[torch.Tensor], algorithm: str, *, merged: Sequence[bool] | None = None):
    """One bucket per merged group, last group first; inside a group the parameters are
    packed in forward order (NOTE [OMGS conventions] in comm/omgs/model.py).

    Args:
        params: the layers in forward order (the order ``merged`` indexes).
        merged: ``merged[i]`` joins layer i to layer i - 1; ``None`` = every layer alone.

    Raises:
        ValueError: if ``merged`` does not have one entry per parameter.
    """
    from comm.omgs.model import groups_from_plan
    from comm.plans import Bucket

    merged = [False] * len(params) if merged is None else [bool(m) for m in merged]
    if len(merged) != len(params):
        raise ValueError(f"OMGS plan has {len(merged)} entries for {len(params)} parameters")
    return [Bucket(tuple(range(s, e)), algorithm) for s, e in reversed(groups_from_plan(merged))]
