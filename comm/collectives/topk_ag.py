"""``topk_ag``: TopK-SGD with all-gather ("NaiveAG"; Algorithm 1 of the gTop-k paper).

Every worker selects the top-k of its gradient plus residual, all workers all-gather the
``k`` values and ``k`` indices, and each scatter-adds all ``P * k`` pairs.
"""
from __future__ import annotations

import torch

from comm import link_bytes
from comm.collectives.base import Exchanger, Stages, add_pairs_, all_gather_async, index_dtype, k_for, pack_pairs

__all__ = ["TopKAllGatherExchanger"]


class TopKAllGatherExchanger(Exchanger):
    """Local top-k, all-gather of values and indices over all workers, scatter-add, / P.

    Error feedback (Algorithm 1, lines 4-8): ``acc = grad + residual``; the residual
    becomes ``acc`` with the selected entries removed. With a narrower wire dtype the
    rounding error of the sent values also stays in the residual, so that
    ``sum(inputs) + sum(old residuals) == P * output + sum(new residuals)``. Values and
    indices travel packed in one all-gather, overlapped as in NOTE [sparse overlap]
    (comm/collectives/hitopk.py).
    """

    name = "topk_ag"
    sparse = True

    def _stages(self, x: torch.Tensor) -> Stages:
        t = self.topology
        acc = self.memory.compensate(x)
        d, k = acc.numel(), k_for(acc.numel(), self.density)
        values, indices = self.topk(acc, k)
        self.memory.mask(indices)
        sent = values.to(self.wire_dtype(x))
        pairs = pack_pairs(sent, indices.to(index_dtype(d)))
        gathered, work = all_gather_async(pairs, None, t.world_size)
        if link_bytes.ring_crosses(t):
            self.inter_node_bytes += link_bytes.ring_allgather(pairs.numel(), t.world_size)
        if self.memory.enabled:  # acc becomes the residual: no copy of d elements
            acc[indices] = values - sent.to(acc.dtype)
            self.memory.update(acc)
        out = torch.zeros(d, dtype=acc.dtype, device=acc.device)
        yield work
        return add_pairs_(out, gathered, k, sent.dtype, index_dtype(d), t.world_size)
