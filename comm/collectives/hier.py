"""``hier``: Jizhi's three-phase hierarchical all-reduce.

Intra-node reduce to the node leader, all-reduce among the leaders, intra-node broadcast:
``4(n-1) + 2(m-1)`` steps instead of ``2(mn-1)``, so it wins on small (latency-bound)
tensors; the hybrid choice in :mod:`comm.fusion` sends small buckets here. Large tensors
are pipelined in segments as in NOTE [2dtar pipelining] (comm/collectives/torus2d.py).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from comm.collectives.base import Exchanger

__all__ = ["HierExchanger"]


class HierExchanger(Exchanger):
    """Reduce to local rank 0, all-reduce over ``leader_group``, broadcast inside the node.

    Attributes:
        segment_bytes: pipelining segment size; default 8 MiB.
    """

    name = "hier"
    segment_bytes = 8 * 2**20

    def _exchange(self, x: torch.Tensor) -> torch.Tensor:
        t = self.topology
        buf = x.to(self.wire_dtype(x), copy=True)
        segments = list(buf.split(max(1, self.segment_bytes // buf.element_size())))
        leader = t.intra_ranks[0]
        intra = t.local_size > 1
        reduces = [dist.reduce(s, dst=leader, group=t.intra_group, async_op=True) if intra else None
                   for s in segments]
        bcasts = []
        for seg, work in zip(segments, reduces):
            if work is not None:
                work.wait()
            if t.is_leader and t.nodes > 1:
                dist.all_reduce(seg, group=t.leader_group)
            if intra:
                bcasts.append(dist.broadcast(seg, src=leader, group=t.intra_group, async_op=True))
        for work in bcasts:
            work.wait()
        return buf.to(x.dtype).div_(t.world_size)
