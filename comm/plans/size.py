"""``size`` plan (Jizhi's tensor fusion): buckets up to a byte threshold, and the hybrid
choice that sends small buckets through ``hier``.

NOTE [dense vectors]: with ``dense_vectors`` a sparse plan takes the parameters of at
most one dimension (batch-norm scales and shifts, biases) out of the sparse buckets and
sends them densely (``hier``) in buckets of their own, launched after the sparse ones
(they are spread over the whole network, so they are complete only when backward ends).
This is what Deep Gradient Compression's reference code does (it compresses only
parameters with ``dim() > 1``): these parameters are under 1 % of a convolutional
network's but steer every layer's scale and offset, and a global top-k over a fused
bucket delays their small gradients like any other entry's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from comm.collectives.hier import HierExchanger
from comm.plans.base import Bucket
from comm.registry import get_algorithm

__all__ = ["SizePlan", "plan_buckets"]


def plan_buckets(params: list[torch.Tensor], bucket_bytes: int,
                 indices: list[int] | None = None) -> list[list[int]]:
    """Group parameter indices into buckets of at most ``bucket_bytes`` (one dtype each).

    Parameters are taken last to first, the order backward produces their gradients; a
    parameter larger than the threshold gets a bucket of its own. ``indices`` (ascending)
    limits the grouping to those parameters (default all).
    """
    buckets: list[list[int]] = []
    size, dtype = 0, None
    for i in reversed(range(len(params)) if indices is None else indices):
        nbytes = params[i].numel() * params[i].element_size()
        if not buckets or params[i].dtype != dtype or size + nbytes > bucket_bytes:
            buckets.append([])
            size, dtype = 0, params[i].dtype
        buckets[-1].append(i)
        size += nbytes
    return buckets


@dataclass(frozen=True)
class SizePlan:
    """Fused buckets of at most ``bucket_bytes`` (default 25 MiB); those under
    ``hybrid_threshold_bytes`` (default 1 MiB; 0 disables the hybrid choice) use ``hier``;
    with ``dense_vectors`` and a sparse algorithm, parameters of at most one dimension go
    densely in buckets of their own, last (NOTE [dense vectors]).

    Raises:
        ValueError: for a non-positive ``bucket_bytes`` or a negative hybrid threshold.
    """

    name: ClassVar[str] = "size"
    bucket_bytes: int = 25 * 2**20
    hybrid_threshold_bytes: int = 2**20
    dense_vectors: bool = False

    def __post_init__(self):
        if self.bucket_bytes <= 0 or self.hybrid_threshold_bytes < 0:
            raise ValueError(f"bucket_bytes must be > 0 and hybrid_threshold_bytes >= 0, "
                             f"got {self.bucket_bytes} and {self.hybrid_threshold_bytes}")

    def buckets(self, params: list[torch.Tensor], algorithm: str):
        dense = HierExchanger.name  # the hybrid choice's algorithm
        split = self.dense_vectors and get_algorithm(algorithm).sparse
        vectors = [i for i, p in enumerate(params) if split and p.dim() <= 1]
        rest = [i for i, p in enumerate(params) if not (split and p.dim() <= 1)]
        out = []
        for bucket in plan_buckets(params, self.bucket_bytes, rest):
            nbytes = sum(params[i].numel() * params[i].element_size() for i in bucket)
            out.append(Bucket(tuple(bucket), dense if nbytes < self.hybrid_threshold_bytes else algorithm))
        return out + [Bucket(tuple(bucket), dense) for bucket in plan_buckets(params, self.bucket_bytes, vectors)]
