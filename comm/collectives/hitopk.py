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

from comm.collectives.base import Exchanger, all_gather_flat, index_dtype, k_for, pad_to_multiple, reduce_scatter_flat

__all__ = ["HiTopKExchanger"]


class HiTopKExchanger(Exchanger):
    """HiTopKComm over ``intra_group`` and ``inter_group`` of the topology."""

    name = "hitopk"
    sparse = True

    def _exchange(self, x: torch.Tensor) -> torch.Tensor:
        t = self.topology
        n, m = t.local_size, t.nodes
        d = x.numel()
        acc_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        full = x.to(acc_dtype)
        chunk = reduce_scatter_flat(pad_to_multiple(full, n) if d % n else full, t.intra_group, n)
        acc = self.memory.compensate(chunk, inplace=True)  # chunk is ours: no copy
        c = acc.numel()
        values, indices = self.topk(acc, k_for(c, self.density))
        sent = values.to(self.wire_dtype(x))
        if self.memory.enabled:  # acc becomes the residual
            acc[indices] = values - sent.to(acc.dtype)
            self.memory.update(acc)
        # step 3: inter-node all-gather among same-local-rank workers
        node_values = all_gather_flat(sent, t.inter_group, m)
        node_indices = all_gather_flat(indices.to(index_dtype(c)), t.inter_group, m)
        # step 4: intra-node all-gather of the gathered pairs; row j belongs to chunk j
        all_values = all_gather_flat(node_values, t.intra_group, n).view(n, -1)
        all_indices = all_gather_flat(node_indices, t.intra_group, n).view(n, -1).long()
        all_indices += torch.arange(n, device=acc.device).unsqueeze(1) * c
        out = torch.zeros(n * c, dtype=acc.dtype, device=acc.device)
        out.index_add_(0, all_indices.reshape(-1), all_values.reshape(-1).to(acc.dtype).div_(t.world_size))
        return out[:d]
