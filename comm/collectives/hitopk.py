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

import torch

from comm import link_bytes
from comm.collectives.base import (Exchanger, Stages, add_pairs_, all_gather_async, all_gather_flat, index_dtype,
                                   pack_pairs, reduce_scatter_flat)
from comm.topk.checks import k_for

__all__ = ["HiTopKExchanger"]


class HiTopKExchanger(Exchanger):
    """HiTopKComm over ``intra_group`` (or the node's shared memory) and ``inter_group``.

    Values and indices travel packed in one tensor, so each level is one all-gather.
    """

    name = "hitopk"
    sparse = True

    def _stages(self, x: torch.Tensor) -> Stages:
        t = self.topology
        n, m = t.local_size, t.nodes
        acc_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        # step 1: chunk local_rank of the node sum (x zero-padded to a multiple of n)
        chunk = reduce_scatter_flat(x.to(acc_dtype), t.intra_group, n, t.shm)
        acc = self.memory.compensate(chunk, inplace=True)  # chunk is ours: no copy
        c, k = acc.numel(), k_for(acc.numel(), self.density)
        values, indices = self.topk(acc, k)  # step 2
        self.memory.mask(indices)  # node-level momentum (NOTE [momentum correction])
        sent = values.to(self.wire_dtype(x))
        # step 3: inter-node all-gather among same-local-rank workers, in the background
        pairs = pack_pairs(sent, indices.to(index_dtype(c)))
        node_pairs, work = all_gather_async(pairs, t.inter_group, m)
        self.inter_node_bytes += link_bytes.ring_allgather(pairs.numel(), m)
        # NOTE [sparse overlap]: the CPU work that does not need the gathered pairs (the
        # residual, and zeroing the d-element output, the costliest allocation) runs while
        # the pairs cross the slow inter-node link. topk_ag does the same.
        if self.memory.enabled:  # acc becomes the residual
            acc[indices] = values - sent.to(acc.dtype)
            self.memory.update(acc)
        out = torch.zeros(n * c, dtype=acc.dtype, device=acc.device)
        yield work
        # step 4: intra-node all-gather of the gathered pairs; row i * m + j: chunk i, node j
        rows = all_gather_flat(node_pairs, t.intra_group, n, t.shm)
        offsets = torch.arange(n, device=acc.device).repeat_interleave(m) * c
        add_pairs_(out, rows, k, sent.dtype, index_dtype(c), t.world_size, offsets)
        return out[: x.numel()]

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
