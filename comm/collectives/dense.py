"""``dense``: one all-reduce over every worker (the baseline; DDP's default)."""
from __future__ import annotations

import torch

from comm import collective_ops as ops
from comm import link_bytes
from comm.algorithm import Algorithm
from comm.cost_model import add_link
from comm.collectives.base import Exchanger, Stages, wire_buffer
from comm.registry import DENSE

__all__ = ["ALGORITHM", "DenseExchanger", "cost"]


class DenseExchanger(Exchanger):
    """All-reduce of the whole tensor over the default group, divided by the world size."""

    name = DENSE

    def _stages(self, x: torch.Tensor, out: torch.Tensor | None) -> Stages:
        buf = wire_buffer(x, self.wire_dtype(x), out)
        if link_bytes.ring_crosses(self.topology):
            self.inter_node_bytes += link_bytes.ring_allreduce(buf.numel() * buf.element_size(), self.topology.world_size)
        yield ops.all_reduce(buf, async_op=True) if self.topology.world_size > 1 else None
        return buf.to(x.dtype).div_(self.topology.world_size)


def cost(c, m, n, d, b, share, **_):
    """Cost formula (:mod:`comm.cost_model`): its terms added to ``c``."""
    p = m * n  # one flat ring; each node's link carries one ring edge
    add_link(c, "inter" if m > 1 else "intra", 2 * (p - 1), 2 * (p - 1) / p * d * b)


ALGORITHM = Algorithm.of(DenseExchanger, cost=cost, auto=True)
