"""``hier``: Jizhi's three-phase hierarchical all-reduce.

Intra-node reduce to the node leader, all-reduce among the leaders, intra-node broadcast:
``4(n-1) + 2(m-1)`` steps instead of ``2(mn-1)``, so it wins on small (latency-bound)
tensors; the hybrid choice of the ``size`` plan (:mod:`comm.plans.size`) sends small
buckets here. Large tensors are pipelined in segments as in NOTE [2dtar pipelining]
(comm/collectives/torus2d.py): the leaders' all-reduce of one segment runs in the
background while the node reduces the next and broadcasts the previous one.
"""
from __future__ import annotations

import torch

from comm import collective_ops as ops
from comm import link_bytes
from comm.algorithm import Algorithm
from comm.cost_model import add_link, log2
from comm.collectives.base import Exchanger, Stages, wire_buffer

__all__ = ["ALGORITHM", "HierExchanger", "cost"]


class HierExchanger(Exchanger):
    """Reduce to local rank 0, all-reduce over ``leader_group``, broadcast inside the node.

    Attributes:
        segment_bytes: pipelining segment size; default 8 MiB.
    """

    name = "hier"
    segment_bytes = 8 * 2**20

    def _stages(self, x: torch.Tensor, out: torch.Tensor | None) -> Stages:
        t = self.topology
        buf = wire_buffer(x, self.wire_dtype(x), out)
        pending = []  # (leaders' all-reduce, segment)
        for seg in buf.split(max(1, self.segment_bytes // buf.element_size())):
            self._intra(seg, "reduce")
            work = ops.all_reduce(seg, group=t.leader_group, async_op=True) if t.is_leader and t.nodes > 1 else None
            if work is not None:
                self.inter_node_bytes += link_bytes.ring_allreduce(seg.numel() * seg.element_size(), t.nodes)
            pending.append((work, seg))
            if len(pending) > 1:
                yield from self._broadcast(*pending.pop(0))
        for p in pending:
            yield from self._broadcast(*p)
        return buf.to(x.dtype).div_(t.world_size)

    def _broadcast(self, work, seg: torch.Tensor) -> Stages:
        yield work  # None on non-leaders: the same stage boundary on every rank
        self._intra(seg, "broadcast")

    def _intra(self, seg: torch.Tensor, op: str) -> None:
        """In-place reduce to / broadcast from local rank 0 (shared memory for CPU tensors)."""
        t = self.topology
        if t.local_size == 1:
            return
        if t.shm is not None and seg.device.type == "cpu":
            if (t.shm.reduce_ if op == "reduce" else t.shm.broadcast_)(seg) is not None:
                return
        if op == "reduce":
            ops.reduce(seg, dst=t.intra_ranks[0], group=t.intra_group)
        else:
            ops.broadcast(seg, src=t.intra_ranks[0], group=t.intra_group)


def cost(c, m, n, d, b, **_):
    """Cost formula (:mod:`comm.cost_model`): its terms added to ``c``."""
    add_link(c, "intra", 2 * log2(n), 2 * log2(n) * d * b)        # tree reduce + broadcast
    add_link(c, "inter", 2 * (m - 1), 2 * (m - 1) / m * d * b)      # ring among leaders


ALGORITHM = Algorithm.of(HierExchanger, cost=cost, auto=True)
