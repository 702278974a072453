"""``topk_ag``: TopK-SGD with all-gather ("NaiveAG"; Algorithm 1 of the gTop-k paper).

Every worker selects the top-k of its gradient plus residual, all workers all-gather the
``k`` values and ``k`` indices, and each scatter-adds all ``P * k`` pairs.
"""
from __future__ import annotations

import math

import torch

from comm import link_bytes
from comm.algorithm import Algorithm
from comm.cost_model import add_link, log2
from comm.collectives.base import Exchanger, Stages, all_gather_async
from comm.collectives.pairs import add_pairs_, index_dtype, pack_pairs, pair_bytes, remove_sent_
from comm.topk.checks import k_for

__all__ = ["ALGORITHM", "TopKAllGatherExchanger", "cost"]


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

    def _stages(self, x: torch.Tensor, out: torch.Tensor | None) -> Stages:
        t = self.topology
        acc = self.memory.compensate(x)
        d, k = acc.numel(), k_for(acc.numel(), self.density)
        wire, idx_dtype = self.wire_dtype(x), index_dtype(d)
        values, indices = self.topk(acc, k)
        self.memory.mask(indices)
        pairs = pack_pairs(values, indices, wire, idx_dtype)
        del values, indices  # NOTE [exchange working memory]: the k pairs hold the selection now
        gathered, work = all_gather_async(pairs, None, t.world_size)
        if link_bytes.ring_crosses(t):
            self.inter_node_bytes += link_bytes.ring_allgather(pairs.numel(), t.world_size)
        if self.memory.enabled:  # acc becomes the residual: no copy of d elements
            remove_sent_(acc, pairs, k, wire, idx_dtype)
            self.memory.update(acc)
        out = acc.new_zeros(d) if out is None else out.zero_()  # x is read no more
        yield work
        return add_pairs_(out, gathered, k, wire, idx_dtype, t.world_size)

    def inflight_bytes(self, numel: int) -> int:
        """The k pairs sent and the ``P k`` gathered."""
        return pair_bytes(k_for(numel, self.density), self.value_dtype, numel) * (1 + self.topology.world_size)


def cost(c, m, n, d, b, bi, rho, allgather, **_):
    """Cost formula (:mod:`comm.cost_model`): its terms added to ``c``."""
    p, k = m * n, math.ceil(rho * d)
    c["gamma"] += d
    steps = p - 1 if allgather == "ring" else log2(p)  # NOTE [all-gather latency]
    add_link(c, "inter" if m > 1 else "intra", steps, (p - 1) * k * (b + bi))


ALGORITHM = Algorithm.of(TopKAllGatherExchanger, cost=cost)
