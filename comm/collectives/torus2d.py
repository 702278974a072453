"""``2dtar``: 2D-torus all-reduce (Mikami et al. 2018; MLSys'21 section 5.3).

Intra-node reduce-scatter, then an all-reduce of each ``d/n`` chunk among the workers
with the same local rank on every node (``n`` concurrent inter-node all-reduces, each of
``1/n`` of the data), then an intra-node all-gather.

NOTE [2dtar pipelining]: a large tensor is cut into segments of about
``segment_bytes`` and the three phases are pipelined across segments with async ops:
while segment ``s`` crosses the slow inter-node link, segment ``s+1`` is being
reduce-scattered and segment ``s-1`` all-gathered inside the node (the intra and inter
groups are separate communicators, so their ops run concurrently). The result is the
same as the unsegmented algorithm.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from comm.collectives.base import Exchanger, pad_to_multiple

__all__ = ["Torus2DExchanger"]

_RS = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_AG = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class Torus2DExchanger(Exchanger):
    """Reduce-scatter (intra) -> all-reduce (inter, per local rank) -> all-gather (intra).

    Attributes:
        segment_bytes: pipelining segment size (NOTE [2dtar pipelining]); default 8 MiB.
    """

    name = "2dtar"
    segment_bytes = 8 * 2**20

    def _exchange(self, x: torch.Tensor) -> torch.Tensor:
        t = self.topology
        n = t.local_size
        buf = x.to(self.wire_dtype(x))
        per_segment = max(n, self.segment_bytes // buf.element_size() // n * n)
        buf = pad_to_multiple(buf, n) if buf.numel() % n else buf
        segments = list(buf.split(per_segment))
        chunks = [torch.empty(s.numel() // n, dtype=buf.dtype, device=buf.device) for s in segments]
        out = torch.empty_like(buf)
        gathered = list(out.split(per_segment))
        if n > 1:
            rs = [_RS(c, s, group=t.intra_group, async_op=True) for c, s in zip(chunks, segments)]
        else:
            rs = [None] * len(segments)
            for c, s in zip(chunks, segments):
                c.copy_(s)
        ag = []
        for i, chunk in enumerate(chunks):
            if rs[i] is not None:
                rs[i].wait()
            if t.nodes > 1:
                dist.all_reduce(chunk, group=t.inter_group)
            if n > 1:
                ag.append(_AG(gathered[i], chunk, group=t.intra_group, async_op=True))
            else:
                gathered[i].copy_(chunk)
        for work in ag:
            work.wait()
        return out[: x.numel()].to(x.dtype).div_(t.world_size)
