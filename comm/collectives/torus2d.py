"""``2dtar``: 2D-torus all-reduce (Mikami et al. 2018; MLSys'21 section 5.3).

Intra-node reduce-scatter, then an all-reduce of each ``d/n`` chunk among the workers
with the same local rank on every node (``n`` concurrent inter-node all-reduces, each of
``1/n`` of the data), then an intra-node all-gather.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from comm.collectives.base import Exchanger, all_gather_flat, pad_to_multiple, reduce_scatter_flat

__all__ = ["Torus2DExchanger"]


class Torus2DExchanger(Exchanger):
    """Reduce-scatter (intra) -> all-reduce (inter, per local rank) -> all-gather (intra)."""

    name = "2dtar"

    def _exchange(self, x: torch.Tensor) -> torch.Tensor:
        t = self.topology
        n = t.local_size
        buf = pad_to_multiple(x.to(self.wire_dtype(x)), n)
        chunk = reduce_scatter_flat(buf, t.intra_group, n)
        if t.nodes > 1:
            dist.all_reduce(chunk, group=t.inter_group)
        out = all_gather_flat(chunk, t.intra_group, n)
        return out[: x.numel()].to(x.dtype).div_(t.world_size)
