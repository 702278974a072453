"""``topk_ag``: TopK-SGD with all-gather ("NaiveAG"; Algorithm 1 of the gTop-k paper).

Every worker selects the top-k of its gradient plus residual, all workers all-gather the
``k`` values and ``k`` indices, and each scatter-adds all ``P * k`` pairs.
"""
from __future__ import annotations

import torch

from comm.collectives.base import Exchanger, all_gather_flat, index_dtype, k_for

__all__ = ["TopKAllGatherExchanger"]


class TopKAllGatherExchanger(Exchanger):
    """Local top-k, all-gather of values and indices over all workers, scatter-add, / P.

    Error feedback (Algorithm 1, lines 4-8): ``acc = grad + residual``; the residual
    becomes ``acc`` with the selected entries removed. With a narrower wire dtype the
    rounding error of the sent values also stays in the residual, so that
    ``sum(inputs) + sum(old residuals) == P * output + sum(new residuals)``.
    """

    name = "topk_ag"
    sparse = True

    def _exchange(self, x: torch.Tensor) -> torch.Tensor:
        t = self.topology
        acc = self.memory.compensate(x)
        d = acc.numel()
        values, indices = self.topk(acc, k_for(d, self.density))
        sent = values.to(self.wire_dtype(x))
        if self.memory.enabled:  # acc becomes the residual: no copy of d elements
            acc[indices] = values - sent.to(acc.dtype)
            self.memory.update(acc)
        all_values = all_gather_flat(sent, None, t.world_size)
        all_indices = all_gather_flat(indices.to(index_dtype(d)), None, t.world_size)
        out = torch.zeros(d, dtype=acc.dtype, device=acc.device)
        out.index_add_(0, all_indices.long(), all_values.to(acc.dtype).div_(t.world_size))
        return out
