"""``size`` plan (Jizhi's tensor fusion): buckets up to a byte threshold, and the hybrid
choice that sends small buckets through ``hier``."""
from __future__ import annotations

import torch

__all__ = ["plan", "plan_buckets"]


def plan_buckets(params: list[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """Group parameter indices into buckets of at most ``bucket_bytes`` (one dtype each).

    Parameters are taken last to first, the order backward produces their gradients; a
    parameter larger than the threshold gets a bucket of its own.
    """
    buckets: list[list[int]] = []
    size, dtype = 0, None
    for i in reversed(range(len(params))):
        nbytes = params[i].numel() * params[i].element_size()
        if not buckets or params[i].dtype != dtype or size + nbytes > bucket_bytes:
            buckets.append([])
            size, dtype = 0, params[i].dtype
        buckets[-1].append(i)
        size += nbytes
    return buckets


def plan(params: list[torch.Tensor], algorithm: str, *, bucket_bytes: int = 25 * 2**20,
         hybrid_threshold_bytes: int = 2**20):
    """Fused buckets of at most ``bucket_bytes``; those under ``hybrid_threshold_bytes`` use
    ``hier`` (0 disables the hybrid choice).

    Raises:
        ValueError: for a non-positive ``bucket_bytes`` or a negative hybrid threshold.
    """
    from comm.plans import Bucket

    if bucket_bytes <= 0 or hybrid_threshold_bytes < 0:
        raise ValueError(f"bucket_bytes must be > 0 and hybrid_threshold_bytes >= 0, "
                         f"got {bucket_bytes} and {hybrid_threshold_bytes}")
    out = []
    for bucket in plan_buckets(params, bucket_bytes):
        nbytes = sum(params[i].numel() * params[i].element_size() for i in bucket)
        out.append(Bucket(tuple(bucket), "hier" if nbytes < hybrid_threshold_bytes else algorithm))
    return out
