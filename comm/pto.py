"""Parallel tensor operator (PTO, MLSys 2021 section 4.2): share work whose inputs every
rank already holds, then all-gather the (small) results.

After gradient aggregation all ranks hold the same parameters and gradients, so an
operation ``r = OP(g)`` gives the same answer everywhere. PTO splits the items into P
contiguous shares, rank p computes ``OP`` on share p only, and one all-gather of the
results gives every rank the full answer: P times less compute for one small collective.
For LARS the items are layers and each result is one scalar (a trust ratio).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from comm import collective_ops as ops

__all__ = ["shard_bounds", "parallel_scalars"]


def shard_bounds(n: int, world_size: int, rank: int) -> tuple[int, int]:
    """Return ``[start, stop)`` of rank ``rank``'s contiguous share of ``n`` items.

    The first ``n % world_size`` ranks take one item more, as in the paper's example
    (161 ResNet-50 layers on 128 GPUs: rank 0 computes layers 1-2, rank 1 layers 3-4, ...).

    Raises:
        ValueError: for n < 0, world_size < 1 or a rank outside ``[0, world_size)``.
    """
    if n < 0 or world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need n >= 0, world_size >= 1, 0 <= rank < world_size; got {n=}, {world_size=}, {rank=}")
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def parallel_scalars(op: Callable[[Sequence], torch.Tensor], items: Sequence, *,
                     group: dist.ProcessGroup | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
    """Compute ``op`` over ``items`` with the work split across the ranks of ``group``.

    Args:
        op: maps a (possibly empty) list of items to a 1-D float32 tensor with one
            scalar per item. It must give every rank the same value for the same item.
        items: the same sequence on every rank.
        group: process group (default: the world). Without an initialised process group,
            or with one rank, ``op(items)`` is computed locally.
        device: where the gathered buffer lives (the backend's device: cuda for NCCL).

    Returns:
        A float32 tensor of ``len(items)`` scalars, identical on every rank and equal to
        ``op(items)`` computed on one rank.

    Raises:
        ValueError: if ``op`` returns the wrong number of scalars.

    Example:
        >>> norms = parallel_scalars(lambda ts: torch.stack([t.norm() for t in ts]) if ts else torch.zeros(0),
        ...                          [torch.ones(3), torch.ones(4)])  # doctest: +SKIP
    """
    n = len(items)
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return _checked(op(list(items)), n).to(device)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    start, stop = shard_bounds(n, world, rank)
    width = -(-n // world)  # every share padded to the largest so one all_gather suffices
    mine = torch.zeros(width, dtype=torch.float32, device=device)
    if stop > start:
        mine[: stop - start] = _checked(op(list(items[start:stop])), stop - start).to(device)
    out = torch.empty(world * width, dtype=torch.float32, device=device)
    ops.all_gather_into(out, mine, group=group) if _has_gather_into_tensor(group) else \
        ops.all_gather_list(list(out.view(world, width).unbind(0)), mine, group=group)
    rows = out.view(world, width)
    return torch.cat([rows[r, : b - a] for r in range(world) for a, b in [shard_bounds(n, world, r)]])


def _checked(values: torch.Tensor, n: int) -> torch.Tensor:
    values = values.reshape(-1).to(torch.float32)
    if values.numel() != n:
        raise ValueError(f"op returned {values.numel()} scalars for {n} items")
    return values


def _has_gather_into_tensor(group) -> bool:
    # NOTE [gloo all_gather]: gloo lacks all_gather_into_tensor on some versions; the
    # list form gives the same bytes, so it is the portable fallback.
    return dist.get_backend(group) == "nccl"
