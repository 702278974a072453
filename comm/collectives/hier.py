"""``hier``: Jizhi's three-phase hierarchical all-reduce.

Intra-node reduce to the node leader, all-reduce among the leaders, intra-node broadcast:
``4(n-1) + 2(m-1)`` steps instead of ``2(mn-1)``, so it wins on small (latency-bound)
tensors; the hybrid choice in :mod:`comm.fusion` sends small buckets here.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from comm.collectives.base import Exchanger

__all__ = ["HierExchanger"]


class HierExchanger(Exchanger):
    """Reduce to local rank 0, all-reduce over ``leader_group``, broadcast inside the node."""

    name = "hier"

    def _exchange(self, x: torch.Tensor) -> torch.Tensor:
        t = self.topology
        buf = x.to(self.wire_dtype(x), copy=True)
        leader = t.intra_ranks[0]
        if t.local_size > 1:
            dist.reduce(buf, dst=leader, group=t.intra_group)
        if t.is_leader and t.nodes > 1:
            dist.all_reduce(buf, group=t.leader_group)
        if t.local_size > 1:
            dist.broadcast(buf, src=leader, group=t.intra_group)
        return buf.to(x.dtype).div_(t.world_size)
