"""``layer`` plan (LAGS): every parameter its own bucket, last parameter first."""
from __future__ import annotations

import torch

__all__ = ["plan"]


def plan(params: list[torch.Tensor], algorithm: str):
    """One bucket per parameter, in backward order."""
    from comm.plans import Bucket

    return [Bucket((i,), algorithm) for i in reversed(range(len(params)))]
