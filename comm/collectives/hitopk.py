"""``hitopk``: HiTopKComm, Algorithm 2 of the MLSys'21 paper.

1. intra-node reduce-scatter: worker ``j`` of node ``i`` holds the node sum of chunk ``j``;
2. top-k of that chunk with ``k~ = rho * d / n``;
3. all-gather of the ``k~`` values and indices among the workers with the same local rank
   (one inter-node stream per local rank: each local rank is its own process and group);
4. intra-node all-gather of the ``m * k~`` gathered pairs, scatter-added by everyone.

NOTE [hitopk error feedback]: the selection runs on node sums, so the residual lives
there too: worker ``j`` of node ``i`` keeps a ``d/n`` residual for chunk ``j`` holding the
part of its node's summed gradient (plus earlier residual) that was not sent. One
residual per (node, chunk) is the exact analogue of Algorithm 1's per-worker residual
with the node as the worker; a per-worker residual before the reduce-scatter could not
know which entries the node-level selection dropped. Conservation holds globally:
``sum(inputs) + sum(old residuals) == P * output + sum(new residuals)``, placing each
residual at its chunk's offset.
"""
from __future__ import annotations

import math

import torch

from comm import link_bytes
from comm.algorithm import Algorithm
from comm.cost_model import add_link, log2
from comm.collectives.base import Exchanger, Stages, all_gather_async, all_gather_flat, reduce_scatter_flat
from comm.collectives.pairs import add_pairs_, index_dtype, pack_pairs, pair_bytes, remove_sent_
from comm.topk.checks import k_for

__all__ = ["ALGORITHM", "HiTopKExchanger", "cost"]


class HiTopKExchanger(Exchanger):
    """HiTopKComm over ``intra_group`` (or the node's shared memory) and ``inter_group``.

    Values and indices travel packed in one tensor, so each level is one all-gather.
    """

    name = "hitopk"
    sparse = True

    def _stages(self, x: torch.Tensor, out: torch.Tensor | None) -> Stages:
        t = self.topology
        n, m = t.local_size, t.nodes
        # step 1: chunk local_rank of the node sum (x zero-padded to a multiple of n)
        dtype = self.result_dtype(x)
        chunk = reduce_scatter_flat(x.to(dtype), t.intra_group, n, t.shm) if n > 1 else x
        acc = self.memory.compensate(chunk, inplace=chunk is not x)  # a chunk of ours: no copy
        c, k = acc.numel(), k_for(acc.numel(), self.density)
        wire, idx_dtype = self.wire_dtype(x), index_dtype(c)
        values, indices = self.topk(acc, k)  # step 2
        self.memory.mask(indices)  # node-level momentum (NOTE [momentum correction])
        pairs = pack_pairs(values, indices, wire, idx_dtype)
        del values, indices  # NOTE [exchange working memory]
        # step 3: inter-node all-gather among same-local-rank workers, in the background
        node_pairs, work = all_gather_async(pairs, t.inter_group, m)
        self.inter_node_bytes += link_bytes.ring_allgather(pairs.numel(), m)
        # NOTE [sparse overlap]: the CPU work that does not need the gathered pairs (the
        # residual, and zeroing the d-element output, the costliest allocation) runs while
        # the pairs cross the slow inter-node link. topk_ag does the same.
        if self.memory.enabled:  # acc becomes the residual
            remove_sent_(acc, pairs, k, wire, idx_dtype)
            self.memory.update(acc)
        # the result in place when the chunks tile it exactly (x is read no more)
        out = out.zero_() if out is not None and out.numel() == n * c else acc.new_zeros(n * c)
        yield work
        del pairs
        # step 4: intra-node all-gather of the gathered pairs; row i * m + j: chunk i, node j
        rows = all_gather_flat(node_pairs, t.intra_group, n, t.shm)
        del node_pairs
        add_pairs_(out, rows, k, wire, idx_dtype, t.world_size, [i * c for i in range(n) for _ in range(m)])
        return out[: x.numel()]

    def inflight_bytes(self, numel: int) -> int:
        """The ``k~`` pairs sent and the ``m k~`` gathered among same-local-rank workers."""
        t = self.topology
        c = -(-numel // t.local_size)
        return pair_bytes(k_for(c, self.density), self.value_dtype, c) * (1 + (t.nodes if t.nodes > 1 else 0))

    def placed_residual(self, numel: int) -> torch.Tensor:
        """The chunk residual (NOTE [hitopk error feedback]) at its chunk's offset: the node
        sum of the next inputs then carries it once."""
        res = self.memory.owed()
        if res is None:
            return torch.zeros(numel)
        c, j = res.numel(), self.topology.local_rank
        full = res.new_zeros(self.topology.local_size * c)
        full[j * c:(j + 1) * c] = res
        return full[:numel]


def cost(c, m, n, d, b, bi, rho, share, **_):
    """Cost formula (:mod:`comm.cost_model`): its terms added to ``c``."""
    kt = math.ceil(rho * d / n)
    add_link(c, "intra", n - 1, (n - 1) / n * d * 4)                 # Eq. (7), fp32 reduce-scatter
    c["gamma"] += d / n                                           # Eq. (8)
    add_link(c, "inter", log2(m), (m - 1) * kt * (b + bi) * share)  # Eq. (9)
    add_link(c, "intra", log2(n), (n - 1) * m * kt * (b + bi))      # Eq. (10)


ALGORITHM = Algorithm.of(HiTopKExchanger, cost=cost, auto=True, per_rank_streams=True)
