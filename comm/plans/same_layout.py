"""The check that every rank runs the same bucket plan (NOTE [same plan everywhere])."""
from __future__ import annotations

import torch
import torch.distributed as dist

from comm import collective_ops as ops

__all__ = ["check_same_layout"]


def check_same_layout(sizes: list[int], topology) -> None:
    """NOTE [same plan everywhere]: every rank must exchange buckets of the same sizes in the
    same order, or the collectives mismatch; a plan made from per-rank timings may differ.
    Refuse to start when ranks disagree (two small all-reduces; collective)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    device = getattr(topology, "device", None) or torch.device("cpu")
    mine = torch.tensor([len(sizes), *sizes], dtype=torch.int64, device=device)
    length = torch.tensor([mine.numel()], dtype=torch.int64, device=device)
    ops.all_reduce(length, op=dist.ReduceOp.MAX)
    hi = torch.full((int(length),), -1, dtype=torch.int64, device=device)
    hi[:mine.numel()] = mine
    lo = hi.clone()
    ops.all_reduce(hi, op=dist.ReduceOp.MAX)
    ops.all_reduce(lo, op=dist.ReduceOp.MIN)
    if not torch.equal(hi, lo):
        raise ValueError("ranks disagree on the gradient buckets (plan or parameter order); compute the "
                         "plan once and share it, e.g. with comm.omgs.broadcast_plan()")
