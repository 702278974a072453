"""``2dtar``: 2D-torus all-reduce (Mikami et al. 2018; MLSys'21 section 5.3).

Intra-node reduce-scatter, then an all-reduce of each ``d/n`` chunk among the workers
with the same local rank on every node (``n`` concurrent inter-node all-reduces, each of
``1/n`` of the data), then an intra-node all-gather.

NOTE [2dtar pipelining]: a large tensor is cut into segments of about
``segment_bytes`` and the phases are pipelined across segments: the inter-node
all-reduce of segment ``s`` runs in the background (its own communicator) while this
thread reduce-scatters segment ``s+1`` and all-gathers segment ``s-1`` inside the node
(over shared memory for CPU tensors, NOTE [intra-node transport] in comm/topology.py).
The result is the same as the unsegmented algorithm.
"""
from __future__ import annotations

import torch

from comm import collective_ops as ops
from comm import link_bytes
from comm.algorithm import Algorithm
from comm.cost_model import add_link
from comm.collectives.base import Exchanger, Stages, all_gather_flat, reduce_scatter_flat

__all__ = ["ALGORITHM", "Torus2DExchanger", "cost"]


class Torus2DExchanger(Exchanger):
    """Reduce-scatter (intra) -> all-reduce (inter, per local rank) -> all-gather (intra).

    Attributes:
        segment_bytes: pipelining segment size (NOTE [2dtar pipelining]); default 8 MiB.
    """

    name = "2dtar"
    segment_bytes = 8 * 2**20

    def _stages(self, x: torch.Tensor, out: torch.Tensor | None) -> Stages:
        t = self.topology
        n = t.local_size
        buf = x.to(self.wire_dtype(x))
        per_segment = max(n, self.segment_bytes // buf.element_size() // n * n)
        # in place when it fits: segment s is written only after every segment up to s + 1
        # was reduce-scattered (read) from x (NOTE [exchange working memory])
        if out is None or buf.numel() % n or out.dtype != buf.dtype:
            out = torch.empty(-(-buf.numel() // n) * n, dtype=buf.dtype, device=buf.device)
        pending = []  # (inter-node all-reduce, its chunk, where the segment's result goes)
        for start in range(0, buf.numel(), per_segment):
            chunk = reduce_scatter_flat(buf[start: start + per_segment], t.intra_group, n, t.shm)
            work = ops.all_reduce(chunk, group=t.inter_group, async_op=True) if t.nodes > 1 else None
            self.inter_node_bytes += link_bytes.ring_allreduce(chunk.numel() * chunk.element_size(), t.nodes)
            pending.append((work, chunk, out[start: start + n * chunk.numel()]))
            if len(pending) > 1:
                yield from self._gather(*pending.pop(0))
        for p in pending:
            yield from self._gather(*p)
        return out[: x.numel()].to(x.dtype).div_(t.world_size)

    def inflight_bytes(self, numel: int) -> int:
        """Two segments' chunks (one all-reduced in the background, the next reduce-scattered)."""
        return 2 * min(numel * 4, self.segment_bytes) // self.topology.local_size

    def _gather(self, work, chunk: torch.Tensor, dst: torch.Tensor) -> Stages:
        yield work
        all_gather_flat(chunk, self.topology.intra_group, self.topology.local_size, self.topology.shm, out=dst)


def cost(c, m, n, d, b, share, **_):
    """Cost formula (:mod:`comm.cost_model`): its terms added to ``c``."""
    add_link(c, "intra", 2 * (n - 1), 2 * (n - 1) / n * d * b)      # reduce-scatter + all-gather
    add_link(c, "inter", 2 * (m - 1), 2 * (m - 1) / m * d / n * b * share)


ALGORITHM = Algorithm.of(Torus2DExchanger, cost=cost, auto=True, per_rank_streams=True)
