"""Rank, device and collective helpers of the training loop."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

from comm import collective_ops as ops

__all__ = ["world", "pick_device", "broadcast_model", "broadcast_buffers", "all_true",
           "all_sum", "loader_counts"]


def world() -> tuple[int, int]:
    """``(rank, world_size)`` of the default group, ``(0, 1)`` without one."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def pick_device(choice: str) -> torch.device:
    """``cuda`` (device LOCAL_RANK) for "cuda", or "auto" with a GPU; else ``cpu``."""
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_model(model: nn.Module) -> None:
    """Give every rank rank 0's parameters and buffers (identical replicas at start)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        for t in list(model.parameters()) + list(model.buffers()):
            ops.broadcast(t.data, src=0)


def all_true(flag: bool, device: torch.device) -> bool:
    """Whether ``flag`` holds on every rank (one 1-element all-reduce)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return flag
    t = torch.tensor([0.0 if flag else 1.0], device=device if dist.get_backend() == "nccl" else "cpu")
    ops.all_reduce(t)
    return t.item() == 0


def broadcast_buffers(model: nn.Module) -> None:
    """BN running statistics differ per rank; evaluate (and save) rank 0's everywhere."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        for b in model.buffers():
            ops.broadcast(b.data, src=0)


def all_sum(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Sum a small CPU tensor over all ranks (through the device for NCCL); CPU result."""
    if not dist.is_initialized():
        return values
    on = values.to(device) if dist.get_backend() == "nccl" else values
    ops.all_reduce(on)
    return on.cpu()


def loader_counts(loader) -> dict[str, float]:
    """Cumulative counts of the loader's cache reads by level (its ``cache_hits``, named as
    ``loaders.dataloader.HIT_COUNTERS``; none for a loader without a cache), then
    ``skipped``: the bad samples it replaced (NOTE [replacing bad samples] in
    ``loaders.replacement``). Every rank's loader has the same names, in the same order.

    NOTE [cache counters]: the cache counts per process. Both loaders sum the counts their
    batches bring back from the worker processes (``loader.cache_hits``); the DALI loader
    with DALI's resize reads the cache in this process and reports its cache's counters.
    """
    counts = {k: float(v) for k, v in getattr(loader, "cache_hits", {}).items()}
    counts["skipped"] = float(len(getattr(loader, "skipped", ())))
    return counts
