"""Gradient exchange for the training loop: one object per phase with ``synchronize()``.

``build_exchange(name, model, topology, density=..., selector=...)`` returns an object
that averages every ``p.grad`` across ranks in place (``synchronize()``), exposes
``state_dict()`` / ``load_state_dict()`` (error-feedback residuals) and, when it can
tell them apart, ``last_timings = {"compress": s, "communicate": s}`` for the time
breakdown. Names: ``dense``, ``hier``, ``2dtar``, ``topk_ag``, ``gtopk``, ``hitopk``
(``comm.GradientExchanger``) and ``omgs`` (``comm.omgs.OMGSExchanger``). Without the
collectives package, ``dense`` falls back to a fused ``torch.distributed.all_reduce``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["LocalTopology", "topology_for", "build_exchange", "DenseAllReduce"]


@dataclass(frozen=True)
class LocalTopology:
    """``nodes`` x ``local_size`` ranks (used when ``comm.Topology`` is unavailable)."""

    nodes: int = 1
    local_size: int = 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.local_size


def topology_for(world_size: int, nodes: int | None = None, local_size: int | None = None):
    """The topology of this job: explicit ``nodes``/``local_size`` or torchrun's environment.

    Raises:
        ValueError: when nodes x local_size differs from the world size (says what to pass).
    """
    if nodes is None and local_size is None:
        try:
            from comm import Topology

            return Topology.from_env()
        except ImportError:
            import os

            local_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if nodes is None:
        nodes = max(1, world_size // local_size)
    if local_size is None:
        local_size = max(1, world_size // nodes)
    if nodes * local_size != world_size:
        raise ValueError(f"topology {nodes} nodes x {local_size} workers = {nodes * local_size} ranks, but the world "
                         f"size is {world_size}; pass --nodes/--local-size whose product is {world_size}")
    try:
        from comm import Topology

        return Topology(nodes=nodes, local_size=local_size)
    except ImportError:
        return LocalTopology(nodes=nodes, local_size=local_size)


class DenseAllReduce:
    """Average gradients with one fused all-reduce (sum / world) per bucket of ``bucket_bytes``."""

    def __init__(self, params, bucket_bytes: int = 25 * 2**20):
        self.params = [p for p in params if p.requires_grad]
        self.bucket_bytes = bucket_bytes
        self.last_timings = {"compress": 0.0, "communicate": 0.0}

    def synchronize(self) -> None:
        start = time.perf_counter()
        world = dist.get_world_size() if dist.is_initialized() else 1
        grads = [p.grad for p in self.params if p.grad is not None]
        if world > 1 and grads:
            bucket, size = [], 0
            for g in grads + [None]:
                if g is not None:
                    bucket.append(g)
                    size += g.numel() * g.element_size()
                if bucket and (g is None or size >= self.bucket_bytes):
                    flat = torch.cat([b.reshape(-1) for b in bucket])
                    dist.all_reduce(flat)
                    flat.div_(world)
                    offset = 0
                    for b in bucket:
                        b.copy_(flat[offset:offset + b.numel()].view_as(b))
                        offset += b.numel()
                    bucket, size = [], 0
        self.last_timings = {"compress": 0.0, "communicate": time.perf_counter() - start}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def build_exchange(name: str, model: nn.Module, topology, *, density: float, selector: str):
    """The exchanger for phase algorithm ``name`` (see the module docstring).

    Raises:
        ValueError: for an unknown name, or one whose package this checkout lacks.
    """
    try:
        import comm
    except ImportError:  # pragma: no cover
        comm = None
    if name == "omgs":
        try:
            from comm.omgs import OMGSExchanger
        except ImportError:
            raise ValueError("--comm omgs needs comm.omgs.OMGSExchanger, which this checkout lacks") from None
        return OMGSExchanger(model, topology=topology, density=density, selector=selector)
    exchanger_cls = getattr(comm, "GradientExchanger", None)
    if exchanger_cls is None:
        if name == "dense":
            return DenseAllReduce(model.parameters())
        raise ValueError(f"--comm {name} needs comm.GradientExchanger (the collectives package), which this "
                         f"checkout lacks; use --comm dense")
    return exchanger_cls([p for p in model.parameters() if p.requires_grad], name, topology, density=density,
                         selector=selector, error_feedback=True)
