"""``gtopk``: gTop-k S-SGD with gTopKAllReduce (Algorithms 3 and 4 of the ICDCS'19 paper).

Each worker selects its local top-k. In round ``r`` (``step = 2**r``) every worker whose
rank is a multiple of ``2 * step`` receives the ``k`` pairs of rank ``+ step`` (when it
exists) and keeps the top-k of the merged sparse sum; the sender is done. After
``ceil(log2 P)`` rounds rank 0 holds the global top-k, which it broadcasts. Ranks without
a partner in a round simply carry their set forward, so any world size works.

NOTE [gtopk error feedback]: as Algorithm 4: ``residual = acc`` minus the local
selection (line 8) plus the local selections that missed the global mask (line 10).
That rule alone loses the partial sums a merge drops at an index that a later merge
selects again (its contributors see ``gMask = 1``). So each merging worker also notes
what it dropped, and each sender the rounding error of a narrower wire dtype, and after
the broadcast adds those notes to its residual at indices inside the global mask only
(outside it, the contributors already keep their own values by line 10). Then
``sum(inputs) + sum(old residuals) == P * output + sum(new residuals)`` holds exactly.

NOTE [gtopk's training defaults]: a training phase runs ``gtopk`` at density 0.02 with
residuals that follow the learning rate, where the other sparse algorithms default to
0.01 with residuals in gradient units (``Algorithm.density``, ``lr_scaled_residuals``;
a recipe, ``--density`` or ``--set`` still decides). gTop-k applies the ``k`` entries of
the global selection a step, where a top-k all-gather applies up to ``P k`` and
``hitopk`` up to ``m k``; the paper (Section V.B) shows the cost when a run has few
steps (ResNet-20 9 points below Top-k S-SGD at 5,880 iterations) and restores accuracy
with more updates. Measured on CIFAR-10, 8 epochs (3,120 steps), 2 nodes x 2, 3 seeds
(docs/benchmarks/history/train.md, issue 30), mean top-1 against dense's: -1.83 at 0.01, -1.23 with
the rate-following residuals, -1.20 at 0.02, **-0.89 with both**, at 4.41 % of dense's
inter-node bytes (``hitopk`` at 0.01: -0.27, 2.98 %; the rescale does not help it). So
``--comm dense,hitopk,gtopk`` compares each algorithm at its own defaults, and the
tables say each run's density and bytes.
"""
from __future__ import annotations

import math

import torch

from comm import collective_ops as ops
from comm import link_bytes
from comm.algorithm import Algorithm
from comm.cost_model import add_link, log2
from comm.collectives.base import Exchanger, Stages
from comm.collectives.pairs import index_dtype, pair_bytes
from comm.topk.checks import k_for

__all__ = ["ALGORITHM", "GTopKExchanger", "merge_topk", "cost"]


def merge_topk(idx_a, val_a, idx_b, val_b, k: int, numel: int | None = None):
    """The paper's top-k operation on two sparse vectors (Definition 1).

    Returns ``(kept_idx, kept_val, dropped_idx, dropped_val)`` of the summed union, indices
    ascending; the kept part holds the ``k`` largest magnitudes (exact
    ``torch.topk``). ``numel``: the length of the dense vectors; when the two sets cover an
    eighth of it or more, the union is summed in a dense scratch vector instead of sorted
    (NOTE [exchange working memory] in comm/collectives/base.py): the same result, without
    the sort's copies of every index.
    """
    if numel is not None and 8 * (idx_a.numel() + idx_b.numel()) >= numel:
        dense = torch.zeros(numel, dtype=val_a.dtype, device=val_a.device)
        dense.index_add_(0, idx_a, val_a)
        dense.index_add_(0, idx_b, val_b)
        present = torch.zeros(numel, dtype=torch.bool, device=val_a.device)
        present[idx_a] = True
        present[idx_b] = True
        uniq = present.nonzero().squeeze(1)
        del present
        summed = dense[uniq]
        del dense
    else:
        idx = torch.cat([idx_a, idx_b])
        uniq, inverse = torch.unique(idx, return_inverse=True)
        summed = torch.zeros(uniq.numel(), dtype=val_a.dtype, device=val_a.device)
        summed.index_add_(0, inverse, torch.cat([val_a, val_b]))
    if uniq.numel() <= k:  # everything is kept
        return uniq, summed, uniq[:0], summed[:0]
    keep = torch.zeros(uniq.numel(), dtype=torch.bool, device=val_a.device)
    keep[torch.topk(summed.abs(), k, sorted=False).indices] = True
    return uniq[keep], summed[keep], uniq[~keep], summed[~keep]


class _Both:
    """Two ``Work`` handles waited on as one."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def wait(self) -> bool:
        self.a.wait()
        return self.b.wait()

    def is_completed(self) -> bool:
        return self.a.is_completed() and self.b.is_completed()


class GTopKExchanger(Exchanger):
    """gTopKAllReduce over the default group: tree of pairwise top-k merges + broadcast."""

    name = "gtopk"
    sparse = True

    def inflight_bytes(self, numel: int) -> int:
        """The local selection (values, int64 indices, what was sent of them), the pairs
        received or sent in a round and the broadcast's: every rank's most."""
        k = k_for(numel, self.density)
        return 3 * pair_bytes(k, self.value_dtype, numel) + k * (4 + 8 + 4)

    def _stages(self, x: torch.Tensor, out: torch.Tensor | None) -> Stages:
        t = self.topology
        rank, world = t.rank, t.world_size
        acc = self.memory.compensate(x)
        d, k = acc.numel(), k_for(acc.numel(), self.density)
        wire, idx_wire = self.wire_dtype(x), index_dtype(d)
        values, indices = self.topk(acc, k)
        indices = indices.to(idx_wire)  # kept to the end: half the bytes (NOTE [exchange working memory])
        local_sent = values.to(wire).to(acc.dtype)
        residual = acc                                               # no copy of d elements
        if self.memory.enabled:                                      # Alg. 4 line 8 (+ rounding)
            residual[indices] = 0 if local_sent is values else values - local_sent
        notes: list[tuple[torch.Tensor, torch.Tensor]] = []          # NOTE [gtopk error feedback]
        cur_idx, cur_val = indices, local_sent
        step, active = 1, True
        while step < world:  # one yield per round on every rank (NOTE [exchange stages])
            if active and rank % (2 * step) == 0 and rank + step < world:
                r_val = torch.empty(k, dtype=wire, device=acc.device)
                r_idx = torch.empty(k, dtype=idx_wire, device=acc.device)
                yield _Both(ops.irecv(r_val, src=rank + step), ops.irecv(r_idx, src=rank + step))
                cur_idx, cur_val, drop_idx, drop_val = merge_topk(cur_idx, cur_val, r_idx, r_val.to(acc.dtype), k, d)
                notes.append((drop_idx, drop_val))
                del r_val, r_idx  # NOTE [exchange working memory]
            elif active and rank % (2 * step) == step:
                sent = cur_val.to(wire)
                if link_bytes.crosses(rank, rank - step, t.local_size):
                    self.inter_node_bytes += k * (wire.itemsize + idx_wire.itemsize)
                yield _Both(ops.isend(sent, dst=rank - step), ops.isend(cur_idx.to(idx_wire), dst=rank - step))
                if wire != acc.dtype:  # the rounding error (exactly 0 otherwise: no note to keep)
                    notes.append((cur_idx, cur_val - sent.to(acc.dtype)))
                active = False
            else:
                yield None
            step *= 2
        g_val = torch.empty(k, dtype=wire, device=acc.device)
        g_idx = torch.empty(k, dtype=idx_wire, device=acc.device)
        if rank == 0:
            g_val.copy_(cur_val)
            g_idx.copy_(cur_idx)
            if wire != acc.dtype:
                notes.append((cur_idx, cur_val - g_val.to(acc.dtype)))
        self.inter_node_bytes += link_bytes.binomial_broadcast(k * (wire.itemsize + idx_wire.itemsize), t)
        del cur_idx, cur_val
        if world > 1:
            yield _Both(ops.broadcast(g_val, src=0, async_op=True), ops.broadcast(g_idx, src=0, async_op=True))
        out = acc.new_zeros(d) if out is None else out.zero_()  # x is read no more
        out.index_add_(0, g_idx, g_val.to(acc.dtype).div_(world))
        del g_val
        g_mask = torch.zeros(d, dtype=torch.bool, device=acc.device)
        g_mask[g_idx] = True
        missed = ~g_mask[indices]
        if self.memory.masks:
            self.memory.mask(indices[~missed])  # what of ours was applied (NOTE [momentum correction])
        if self.memory.enabled:
            residual.index_add_(0, indices[missed], local_sent[missed])  # Alg. 4 line 10
            for note_idx, note_val in notes:
                inside = g_mask[note_idx]
                residual.index_add_(0, note_idx[inside], note_val[inside])
            self.memory.update(residual)
        return out


def cost(c, m, n, d, b, bi, rho, **_):
    """Cost formula (:mod:`comm.cost_model`): its terms added to ``c``."""
    p, k = m * n, math.ceil(rho * d)
    c["gamma"] += d
    intra = min(log2(n), log2(p))
    inter = log2(p) - intra
    for level, rounds in (("intra", intra), ("inter", inter)):  # tree of merges, then broadcast
        add_link(c, level, 2 * rounds, 2 * rounds * k * (b + bi))


# NOTE [gtopk's training defaults]
ALGORITHM = Algorithm.of(GTopKExchanger, cost=cost, density=0.02, lr_scaled_residuals=True)
