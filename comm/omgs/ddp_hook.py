"""OMGS as a DDP communication hook: ``ddp.register_comm_hook(state, omgs_hook)``.

NOTE [DDP hook grouping]
DDP decides the buckets (``bucket_cap_mb``) and launches each bucket's hook as soon as
the bucket is full, which already overlaps communication with backward. Inside a bucket
the hook applies the OMGS plan: parameters of the same planned group are compressed
together (one top-k over their concatenation, ``k = selected_count(n, rho)``), different
groups separately, and all of the bucket's selections travel in ONE asynchronous
all-gather. To follow a plan exactly, give DDP buckets no larger than the planned groups
(small ``bucket_cap_mb``) or use :class:`comm.omgs.OMGSExchanger` instead. Residuals are
kept per parameter, so DDP's bucket rebuild after the first iteration does not mix them.
"""
# no `from __future__ import annotations`: DDP checks the hook annotations at runtime

from collections.abc import Sequence

import torch
import torch.distributed as dist

from comm.omgs.codec import compress, unpack_add
from comm.omgs.model import groups_from_plan, selected_count
from comm.omgs.pipeline import ordered_params, resolve_group
from comm.omgs.planner import lags_plan
from comm.topk import get_selector

__all__ = ["OMGSHookState", "omgs_hook"]


class OMGSHookState:
    """State of :func:`omgs_hook`.

    Args:
        model: the module wrapped by DDP (or its parameters), forward order.
        topology: ``None`` (default group), a ProcessGroup, or an object with
            ``world_group``/``group``.
        density: fraction of entries sent per group, in (0, 1].
        selector: top-k selector name (default ``"exact"``).
        plan: ``merged`` list over the parameters; ``None`` = every parameter alone.
        error_feedback: keep unsent entries as residuals (default True).

    Raises:
        ValueError: on a bad density, selector or plan length.
    """

    __slots__ = ("group", "world_size", "density", "selector", "error_feedback",  # exchange
                 "group_of", "residuals")  # plan group per parameter id; residual per parameter id

    def __init__(self, model, topology=None, *, density: float, selector: str = "exact",
                 plan: Sequence[bool] | None = None, error_feedback: bool = True):
        if not 0 < density <= 1:
            raise ValueError(f"density must be in (0, 1], got {density}")
        params = ordered_params(model)
        plan = list(plan) if plan is not None else lags_plan(len(params))
        if len(plan) != len(params):
            raise ValueError(f"plan has {len(plan)} entries for {len(params)} parameters")
        self.group = resolve_group(topology)
        self.world_size = dist.get_world_size(self.group)
        self.density, self.selector, self.error_feedback = density, get_selector(selector), error_feedback
        self.group_of = {}
        for gid, (s, e) in enumerate(groups_from_plan(plan)):
            for p in params[s:e]:
                self.group_of[id(p)] = gid
        self.residuals: dict[int, torch.Tensor] = {}


def omgs_hook(state: OMGSHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Compress the bucket's planned groups with top-k + error feedback, all-gather them
    asynchronously, and resolve to the averaged (sparse) bucket.

    Example:
        >>> ddp = DistributedDataParallel(model, bucket_cap_mb=4)  # doctest: +SKIP
        >>> ddp.register_comm_hook(OMGSHookState(model, density=0.001, plan=plan), omgs_hook)  # doctest: +SKIP
    """
    params, grads = bucket.parameters(), bucket.gradients()
    segments: dict[int, list[int]] = {}
    for pos, p in enumerate(params):
        segments.setdefault(state.group_of.get(id(p), -1 - pos), []).append(pos)
    plan, packed = [], []
    for positions in segments.values():
        acc = torch.cat([grads[i].reshape(-1).to(torch.float32) for i in positions])
        if state.error_feedback:
            off = 0
            for i in positions:
                n = grads[i].numel()
                res = state.residuals.get(id(params[i]))
                if res is not None:
                    acc[off:off + n].add_(res)
                off += n
        k = selected_count(acc.numel(), state.density)
        packed.append(compress(acc, k, state.selector, state.error_feedback))
        if state.error_feedback:
            off = 0
            for i in positions:
                n = grads[i].numel()
                state.residuals[id(params[i])] = acc[off:off + n].clone()
                off += n
        plan.append((positions, k))
    send = torch.cat(packed)
    outputs = [torch.empty_like(send) for _ in range(state.world_size)]
    work = dist.all_gather(outputs, send, group=state.group, async_op=True)

    def decompress(fut):
        fut.wait()
        offset = 0
        for positions, k in plan:
            out = torch.zeros(sum(grads[i].numel() for i in positions), dtype=torch.float32,
                              device=send.device)
            for buf in outputs:
                unpack_add(out, buf[offset:offset + 2 * k], k)
            out.div_(state.world_size)
            off = 0
            for i in positions:
                n = grads[i].numel()
                grads[i].copy_(out[off:off + n].view_as(grads[i]))
                off += n
            offset += 2 * k
        return bucket.buffer()

    return work.get_future().then(decompress)
