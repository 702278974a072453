"""``layer`` plan (LAGS): every parameter its own bucket, last parameter first."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from comm.plans.base import Bucket

__all__ = ["LayerPlan"]


@dataclass(frozen=True)
class LayerPlan:
    """One bucket per parameter, in backward order."""

    name: ClassVar[str] = "layer"

    def buckets(self, params: list[torch.Tensor], algorithm: str):

        return [Bucket((i,), algorithm) for i in reversed(range(len(params)))]
