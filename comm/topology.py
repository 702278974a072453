"""Cluster topology: ``nodes x local_size`` workers and the process groups of both levels.

Ranks are laid out node-major, as torchrun does: global rank ``r`` is worker
``r % local_size`` of node ``r // local_size``.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from comm.shm import SharedMemoryGroup

__all__ = ["Topology"]


class Topology:
    """The ``nodes x local_size`` layout of the default process group and its subgroups.

    Must be built after ``torch.distributed.init_process_group``. Creating the groups is
    collective: every rank must build the Topology at the same point of its program.

    Args:
        nodes: number of nodes ``m``; ``None`` derives it from ``local_size``.
        local_size: workers per node ``n``; ``None`` derives it from ``nodes``.
        backend: backend of the subgroups (default: the default group's backend).
        shared_memory: give the node a shared-memory transport for CPU tensors when its
            workers share ``/dev/shm`` (NOTE [intra-node transport]); default True.

    Attributes:
        rank, world_size: of the default group.
        nodes, local_size: the layout (``nodes * local_size == world_size``).
        node_rank, local_rank: this worker's node and its index inside the node.
        intra_group: the workers of my node.
        inter_group: the workers with my ``local_rank`` on every node.
        leader_group: local rank 0 of every node; ``None`` on non-leaders.
        shm: the node's :class:`comm.shm.SharedMemoryGroup`, or ``None`` (one worker per
            node, a backend other than gloo, workers on different hosts, or turned off).
        intra_ranks, inter_ranks, leader_ranks: the global ranks of those groups.
        device: where the collectives run (CUDA on an NCCL group, else CPU).

    Raises:
        RuntimeError: if the default process group is not initialised.
        ValueError: if the layout does not tile the world size evenly.

    Example:
        >>> dist.init_process_group("gloo")          # doctest: +SKIP
        >>> topo = Topology(nodes=2, local_size=2)   # 4 processes act as 2 nodes x 2
    """

    def __init__(self, nodes: int | None = None, local_size: int | None = None, *, backend: str | None = None,
                 shared_memory: bool = True):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("Topology needs torch.distributed.init_process_group() to be called first")
        world, rank = dist.get_world_size(), dist.get_rank()
        self.nodes, self.local_size = _check_layout(world, nodes, local_size)
        self.rank, self.world_size = rank, world
        self.node_rank, self.local_rank = divmod(rank, self.local_size)
        n, m = self.local_size, self.nodes
        self.intra_ranks = [self.node_rank * n + j for j in range(n)]
        self.inter_ranks = [i * n + self.local_rank for i in range(m)]
        self.leader_ranks = [i * n for i in range(m)]
        # NOTE [collective group creation]: new_group is collective over the default
        # group, so every rank creates every group in the same order and keeps its own.
        self.intra_group = self.inter_group = self.leader_group = None
        for i in range(m):
            g = dist.new_group([i * n + j for j in range(n)], backend=backend)
            if i == self.node_rank:
                self.intra_group = g
        for j in range(n):
            g = dist.new_group([i * n + j for i in range(m)], backend=backend)
            if j == self.local_rank:
                self.inter_group = g
        g = dist.new_group(self.leader_ranks, backend=backend)
        self.leader_group = g if self.local_rank == 0 else None
        # NOTE [intra-node transport]: gloo moves intra-node data over TCP loopback, which
        # is CPU-bound; CPU tensors use a shared-memory segment instead (like NCCL's SHM
        # transport). NCCL groups (and mixed backends) keep the process group: NCCL has
        # its own P2P/SHM transports and CUDA tensors never take this path.
        self.shm = None
        if shared_memory and n > 1 and dist.get_backend(self.intra_group) == "gloo":
            self.shm = SharedMemoryGroup.create(self.intra_group, self.local_rank, n)

    @classmethod
    def from_env(cls, *, backend: str | None = None, shared_memory: bool = True) -> "Topology":
        """Build the layout from torchrun's environment (``LOCAL_WORLD_SIZE``, ``LOCAL_RANK``).

        Raises:
            ValueError: if ``LOCAL_WORLD_SIZE`` does not divide the world size or
                ``LOCAL_RANK`` disagrees with the node-major layout.
        """
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("Topology.from_env needs torch.distributed.init_process_group() first")
        world, rank = dist.get_world_size(), dist.get_rank()
        local_size = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        local_rank = os.environ.get("LOCAL_RANK")
        if local_rank is not None and int(local_rank) != rank % max(local_size, 1):
            raise ValueError(
                f"LOCAL_RANK={local_rank} but rank {rank} with LOCAL_WORLD_SIZE={local_size} is local rank "
                f"{rank % max(local_size, 1)}: launch with torchrun (node-major ranks) or pass "
                "Topology(nodes=..., local_size=...) explicitly")
        return cls(local_size=local_size, backend=backend, shared_memory=shared_memory)

    @property
    def device(self) -> torch.device:
        """Where this job's collectives run: the current CUDA device on an NCCL default group,
        else the CPU (NOTE [device check] in comm/collective_ops.py)."""
        backend = str(dist.get_backend())
        if "nccl" in backend and torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    @property
    def is_leader(self) -> bool:
        """Whether this worker is its node's local rank 0."""
        return self.local_rank == 0

    def __repr__(self) -> str:
        return (f"Topology(nodes={self.nodes}, local_size={self.local_size}, rank={self.rank}, "
                f"node_rank={self.node_rank}, local_rank={self.local_rank})")


def _check_layout(world: int, nodes: int | None, local_size: int | None) -> tuple[int, int]:
    for name, v in (("nodes", nodes), ("local_size", local_size)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if nodes is None and local_size is None:
        return 1, world
    if nodes is None:
        if world % local_size:
            raise ValueError(f"world size {world} is not a multiple of local_size={local_size}: "
                             f"start nodes*local_size processes or choose a local_size dividing {world}")
        return world // local_size, local_size
    if local_size is None:
        if world % nodes:
            raise ValueError(f"world size {world} is not a multiple of nodes={nodes}: "
                             f"every node must hold the same number of workers")
        return nodes, world // nodes
    if nodes * local_size != world:
        raise ValueError(f"nodes={nodes} x local_size={local_size} = {nodes * local_size} "
                         f"but the world size is {world}: make nodes * local_size equal the number of processes")
    return nodes, local_size
