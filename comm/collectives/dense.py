"""``dense``: one all-reduce over every worker (the baseline; DDP's default)."""
from __future__ import annotations

import torch

from comm import collective_ops as ops
from comm import link_bytes
from comm.collectives.base import Exchanger, Stages, wire_buffer

__all__ = ["DenseExchanger"]


class DenseExchanger(Exchanger):
    """All-reduce of the whole tensor over the default group, divided by the world size."""

    name = "dense"

    def _stages(self, x: torch.Tensor, out: torch.Tensor | None) -> Stages:
        buf = wire_buffer(x, self.wire_dtype(x), out)
        if link_bytes.ring_crosses(self.topology):
            self.inter_node_bytes += link_bytes.ring_allreduce(buf.numel() * buf.element_size(), self.topology.world_size)
        yield ops.all_reduce(buf, async_op=True) if self.topology.world_size > 1 else None
        return buf.to(x.dtype).div_(self.topology.world_size)
