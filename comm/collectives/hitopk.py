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

NOTE [index union]: with ``index_union`` steps 2-3 become a joint selection across the
nodes, the common-index-set exchange of ScaleCom (Chen et al., NeurIPS 2020, CLT-k) and
Ok-Topk (Li and Hoefler, PPoPP 2022) with the union of every node's choice as the set:
each worker selects its ``k~`` indices as before, the indices are all-gathered among the
same-local-rank workers (``k~`` int32 per node), and every node then sends its *own*
value at *every* index of the union (``<= m k~`` values, one inter-node all-reduce).
An entry that one node chose is thus applied with the whole sum over nodes, not with the
choosing node's part only: the other nodes' parts no longer wait in their residuals
(where parts that cancel in the sum, such as node-local biases of a node's fixed share
of the data, would pile up and later be applied one node at a time) and every applied
entry is what dense training would apply for that step. All residual at the union is
sent, so it is cleared there (the momentum is masked there too). Inter-node bytes per
rank at 2 nodes: ``4 k~`` of indices plus ``4 |U|`` of values (``k~ <= |U| <= 2 k~``),
against ``8 k~`` of (value, index) pairs: at most 1.5x. Two inter-node rounds instead of
one; the intra-node all-gather carries ``m k~`` pairs per chunk, padded with (0, 0.0).
"""
from __future__ import annotations

import torch

from comm import collective_ops as ops
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
        if self.index_union:
            out = yield from self._union_stages(acc, k, x)
            return out
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

    def _union_stages(self, acc: torch.Tensor, k: int, x: torch.Tensor) -> Stages:
        """Steps 2-4 with a joint selection (NOTE [index union])."""
        t = self.topology
        n, m, c = t.local_size, t.nodes, acc.numel()
        idx_dtype, wire = index_dtype(c), self.wire_dtype(x)
        _, indices = self.topk(acc, k)
        gathered, work = all_gather_async(indices.to(idx_dtype), t.inter_group, m)
        self.inter_node_bytes += link_bytes.ring_allgather(k * idx_dtype.itemsize, m)
        yield work
        union = torch.unique(gathered.long())  # sorted: the same on every node
        sent = acc[union].to(wire)
        total = sent.clone()
        work = ops.all_reduce(total, group=t.inter_group, async_op=True) if m > 1 else None
        self.inter_node_bytes += link_bytes.ring_allreduce(total.numel() * wire.itemsize, m)
        self.memory.mask(union)
        if self.memory.enabled:
            acc[union] -= sent.to(acc.dtype)
            self.memory.update(acc)
        out = torch.zeros(n * c, dtype=acc.dtype, device=acc.device)
        yield work
        cap = m * k  # pad to the largest union: the intra-node all-gather needs equal sizes
        values = torch.zeros(cap, dtype=wire, device=acc.device)
        ids = torch.zeros(cap, dtype=idx_dtype, device=acc.device)
        values[:total.numel()], ids[:union.numel()] = total, union.to(idx_dtype)
        rows = all_gather_flat(pack_pairs(values, ids), t.intra_group, n, t.shm)
        add_pairs_(out, rows, cap, wire, idx_dtype, t.world_size, torch.arange(n, device=acc.device) * c)
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
