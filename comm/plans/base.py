"""What a bucket plan returns (:class:`Bucket`) and what the engine asks of a plan
(:class:`Plan`); the planners of :mod:`comm.plans` build on these."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

__all__ = ["Bucket", "Plan"]


@dataclass(frozen=True)
class Bucket:
    """One bucket: parameter indices in packing order, and its exchange algorithm."""

    params: tuple[int, ...]
    algorithm: str


class Plan(Protocol):
    """What the engine asks of a plan."""

    def buckets(self, params: Sequence[torch.Tensor], algorithm: str) -> list[Bucket]:
        """The buckets of ``params`` (forward order) in launch order, main algorithm ``algorithm``."""
